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
def test_gpu_pipelines_read_every_clip_once_and_resume(gpu_video):
    """pipelines=4 on NVDEC (H.264): val has every (file, first frame) once, train resumes mid-epoch
    with the very clips of the uninterrupted epoch (one DALI checkpoint per pipeline)."""
    _require_gpu()
    pytest.importorskip("torch")
    from collections import Counter

    from crossdali.pytorch.video import create_video_loader

    kw = dict(backend="dali-gpu", batch_size=8, sequence_length=8, stride=2, crop_size=48, device_id=0,
              with_frame_num=True, pipelines=4)
    val = create_video_loader(gpu_video / "h264", train=False, **kw)
    seen = Counter((int(lbl), int(f), float(c.sum())) for clips, labels, frames in val
                   for c, lbl, f in zip(clips, labels, frames, strict=True))
    assert sum(seen.values()) == val.num_samples and max(seen.values()) == 1

    whole = [clips.cpu() for clips, _, _ in create_video_loader(gpu_video / "h264", train=True, **kw)]
    first = create_video_loader(gpu_video / "h264", train=True, **kw)
    it = iter(first)
    next(it)
    state = first.state_dict()
    resumed = create_video_loader(gpu_video / "h264", train=True, **kw)
    resumed.load_state_dict(state)
    rest = [clips.cpu() for clips, _, _ in resumed]
    assert len(rest) == len(whole) - 1
    for a, b in zip(whole[1:], rest, strict=True):
        assert (a == b).all()


@pytest.mark.gpu
def test_gpu_matches_cpu_frames(gpu_video):
    """NVDEC and FFmpeg decode the same VP9 frames to within a few grey levels."""
    _require_gpu()
    pytest.importorskip("torch")
    from crossdali.pytorch.video import create_video_loader

    # pipelines=1 on both: the GPU's default splits the shard over several pipelines, another clip order
    kw = dict(train=False, batch_size=4, sequence_length=8, stride=2, crop_size=48, layout="NFHWC", pipelines=1)
    cpu_clips, _ = next(iter(create_video_loader(gpu_video, backend="dali-cpu", **kw)))
    gpu_clips, _ = next(iter(create_video_loader(gpu_video, backend="dali-gpu", device_id=0, **kw)))
    diff = (cpu_clips - gpu_clips.cpu()).abs()
    assert float(diff.mean()) < 0.05, float(diff.mean())  # normalized units (1 grey level ~ 0.017)


@pytest.mark.gpu
def test_gpu_h264_reads_every_legacy_clip_once(gpu_video):
    """Shuffled H.264 on the GPU (train) goes through the legacy fn.readers.video: with 32-frame
    files, 8 frames, stride 2 and step 17 it cuts clips at frames 0 and 17 of every file (the clip's
    15-frame span fits; the experimental reader would start none at 17), each once per epoch, and
    ``len()`` is exact. 20 files x 2 clips: batch 4 divides them, so no policy drops any."""
    _require_gpu()
    pytest.importorskip("torch")
    from crossdali.common.data.sources import DataSource
    from crossdali.common.data.videos import check_videos, count_clips
    from crossdali.common.video import ClipTransform, resolve_video_source
    from crossdali.pytorch.video import create_video_loader

    val = resolve_video_source(gpu_video / "h264", "val")
    src = DataSource(format="filelist", root=val.root, files=val.files, labels=tuple(range(len(val.files))),
                     num_samples=len(val.files))
    t = ClipTransform(sequence_length=8, stride=2, step=17)
    assert count_clips(src, device="gpu", transform=t)[1] == "legacy"
    assert count_clips(src, device="gpu", transform=t, shuffle=False)[1] == "experimental"
    expected = sorted((i, s) for i, info in enumerate(check_videos(src.files, device="gpu"))
                      for s in range(0, info.num_frames - t.span + 1, t.clip_step))
    loader = create_video_loader(src, train=True, backend="dali-gpu", batch_size=4, sequence_length=8, stride=2,
                                 step=17, crop_size=48, device_id=0, with_frame_num=True)
    seen = sorted((int(lbl), int(f)) for _, labels, frames in loader for lbl, f in zip(labels, frames, strict=True))
    assert seen == expected and len(seen) == loader.num_samples and any(f == 17 for _, f in seen)


@pytest.mark.gpu
def test_gpu_legacy_and_experimental_readers_give_the_same_pixels(gpu_video):
    """The two DALI readers decode the same H.264 clips (val order) to within a few grey levels."""
    _require_gpu()
    from crossdali.common.options import PipelineOptions
    from crossdali.common.video import ClipTransform, create_clip_pipeline, resolve_video_source

    src = resolve_video_source(gpu_video / "h264", "val")
    t = ClipTransform(sequence_length=8, stride=2, crop_size=48, output_layout="FHWC")
    opts = PipelineOptions(batch_size=4, num_threads=2, device="gpu", device_id=0)
    out = {}
    for reader in ("legacy", "experimental"):
        pipe = create_clip_pipeline(src, train=False, options=opts, transform=t, validate=False, reader=reader)
        pipe.build()
        clips, labels = pipe.run()
        out[reader] = (clips.as_cpu().as_array(), labels.as_cpu().as_array().reshape(-1))
    assert (out["legacy"][1] == out["experimental"][1]).all()
    diff = np.abs(out["legacy"][0] - out["experimental"][0])
    assert out["legacy"][0].shape == (4, 8, 48, 48, 3) and float(diff.mean()) < 0.05, float(diff.mean())


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
