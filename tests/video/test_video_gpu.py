"""GPU-only video paths: NVDEC clips from H.264 and VP9, optical flow. Run on the GPU machine:

    python -m pytest tests/video -m gpu
"""

from __future__ import annotations

import numpy as np
import pytest


def _require_gpu():
    from nvidia.dali.backend import GetCUDADeviceCount

    if GetCUDADeviceCount() == 0:
        pytest.skip("needs a CUDA GPU (NVDEC / optical-flow engine); none is visible on this machine")


@pytest.mark.gpu
@pytest.mark.parametrize("codec_dir", ["", "h264"])
def test_gpu_clips_vp9_and_h264(gpu_video, codec_dir):
    _require_gpu()
    torch = pytest.importorskip("torch")
    from crossdali.pytorch.video import create_video_loader

    loader = create_video_loader(gpu_video / codec_dir if codec_dir else gpu_video, train=False,
                                 backend="dali-gpu", batch_size=8, sequence_length=8, stride=2, crop_size=48,
                                 device_id=0)
    n = 0
    for clips, labels in loader:
        assert clips.is_cuda and tuple(clips.shape[1:]) == (3, 8, 48, 48) and labels.shape == (clips.shape[0],)
        assert torch.isfinite(clips).all()
        n += clips.shape[0]
    assert n == loader.num_samples > 0


@pytest.mark.gpu
def test_gpu_matches_cpu_frames(gpu_video):
    """NVDEC and FFmpeg decode the same VP9 frames to within a few grey levels."""
    _require_gpu()
    pytest.importorskip("torch")
    from crossdali.pytorch.video import create_video_loader

    kw = dict(train=False, batch_size=4, sequence_length=8, stride=2, crop_size=48, layout="NFHWC")
    cpu_clips, _ = next(iter(create_video_loader(gpu_video, backend="dali-cpu", **kw)))
    gpu_clips, _ = next(iter(create_video_loader(gpu_video, backend="dali-gpu", device_id=0, **kw)))
    diff = (cpu_clips - gpu_clips.cpu()).abs()
    assert float(diff.mean()) < 0.05, float(diff.mean())  # normalized units (1 grey level ~ 0.017)


@pytest.mark.gpu
def test_optical_flow_follows_the_motion(gpu_video, tmp_path):
    _require_gpu()
    from crossdali.video.optical_flow import get_args_parser, main

    summary = main(get_args_parser().parse_args(["--data", str(gpu_video), "--output-dir", str(tmp_path)]))
    per = summary["per_class"]
    assert per["up"]["mean_dy"] < -0.1 < 0.1 < per["down"]["mean_dy"], per
    assert per["grow"]["mean_radial"] > 0 > per["shrink"]["mean_radial"], per
    assert (tmp_path / "optical_flow.png").stat().st_size > 1000
    assert np.isfinite(summary["flow_fields_per_s"])
