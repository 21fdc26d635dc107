"""Bad video input fails early with an error that names the file and the fix."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest


def _frames(n: int = 24, side: int = 32) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (n, side, side, 3), dtype=np.uint8)


def _list(tmp_path, *names: str):
    lst = tmp_path / "list.txt"
    lst.write_text("".join(f"{n} 0\n" for n in names))
    return lst


def test_missing_video_in_file_list(tmp_path):
    from crossdali.common.data.videos import check_videos
    from crossdali.common.errors import DataError
    from crossdali.common.video import resolve_video_source

    with pytest.raises(DataError, match=r"list\.txt:1: .*gone\.webm does not exist"):
        resolve_video_source(_list(tmp_path, "gone.webm"), "val")
    with pytest.raises(DataError, match=r"gone\.webm does not exist: fix the path"):
        check_videos([str(tmp_path / "gone.webm")], device="cpu")


def test_non_video_file(tmp_path):
    pytest.importorskip("torch")
    from crossdali.common.errors import DataError
    from crossdali.pytorch.video import create_video_loader

    (tmp_path / "notes.webm").write_bytes(b"this is not a video\n" * 100)
    with pytest.raises(DataError, match=r"notes\.webm is not a video file FFmpeg can read.*remove it"):
        create_video_loader(_list(tmp_path, "notes.webm"), train=False, sequence_length=4)


def test_variable_frame_rate_file(tmp_path):
    from crossdali.common.data.sample_data.video import write_video
    from crossdali.common.data.videos import check_videos
    from crossdali.common.errors import DataError
    from crossdali.video.reencode import reencode

    vfr = tmp_path / "vfr.webm"
    pts = np.cumsum([0] + [40 if i % 2 else 100 for i in range(23)])  # 40 / 100 ms frames, in ms
    write_video(vfr, _frames(), pts=pts.tolist(), time_base=Fraction(1, 1000))
    with pytest.raises(DataError, match=r"vfr\.webm has a variable frame rate.*constant frame rate: "
                                        r"python -m crossdali\.video\.reencode .*vfr\.webm .*--fps 25.*ffmpeg -i"):
        check_videos([str(vfr)], device="cpu")
    # the fix in the message works: the re-encoded file passes and keeps the clip's duration
    fixed = tmp_path / "vfr_cfr.webm"
    n = reencode(vfr, fixed, fps=25)
    (info,) = check_videos([str(fixed)], device="cpu")
    assert info.constant_frame_rate and info.num_frames == n
    assert abs(n / 25 - (pts[-1] / 1000 + 1 / 25)) <= 1 / 25  # the last frame is shown for 1/fps


def test_variable_frame_rate_h264_for_the_gpu_gets_an_h264_fix_with_key_frames_at_clip_starts(tmp_path):
    """On the GPU an H.264 training file keeps H.264 (the legacy reader, fast with shuffled clips):
    the hint re-encodes to an .mp4 with a key frame every clip step, and that fix passes the check
    (probing needs no GPU)."""
    from crossdali.common.data.sample_data.video import write_video
    from crossdali.common.data.videos import check_videos
    from crossdali.common.errors import DataError
    from crossdali.common.video import ClipTransform
    from crossdali.video.reencode import reencode

    vfr = tmp_path / "vfr.mp4"
    pts = np.cumsum([0] + [40 if i % 2 else 100 for i in range(23)])
    write_video(vfr, _frames(side=64), codec="h264", pts=pts.tolist(), time_base=Fraction(1, 1000))
    transform = ClipTransform(sequence_length=4, stride=2)  # clips start every 8 frames
    with pytest.raises(DataError, match=r"vfr\.mp4 has a variable frame rate.*in H\.264 with a key frame at every "
                                        r"clip start.*reencode .*vfr\.mp4 .*vfr_cfr\.mp4 --fps \d+ --key-every 8 .*"
                                        r"-c:v libx264 -preset veryfast -crf 23 -g 8 -keyint_min 8 -sc_threshold 0 "
                                        r"-pix_fmt yuv420p"):
        check_videos([str(vfr)], device="gpu", transform=transform)
    fixed = tmp_path / "vfr_cfr.mp4"
    reencode(vfr, fixed, fps=25, key_every=8)
    (info,) = check_videos([str(fixed)], device="gpu", transform=transform)
    assert info.constant_frame_rate and info.codec == "h264"
    # without a clip transform (no clip step known) the GPU hint still keeps H.264 and says what --key-every is
    with pytest.raises(DataError) as e:
        check_videos([str(vfr)], device="gpu")
    assert "add --key-every with the clip step" in str(e.value) and "vfr_cfr.mp4 --fps" in str(e.value)
    assert "--key-every 8" not in str(e.value) and ".webm" not in str(e.value) and "-c:v libx264" in str(e.value)
    # the CPU cannot decode H.264 at all: there the hint stays VP9
    with pytest.raises(DataError, match=r"vfr\.mp4 is h264; DALI decodes only VP8, VP9 and MJPEG on the CPU"):
        check_videos([str(vfr)], device="cpu", transform=transform)


def test_h264_on_cpu_names_codec_and_fix(tiny_video):
    pytest.importorskip("torch")
    from crossdali.common.errors import DataError
    from crossdali.pytorch.video import create_video_loader

    with pytest.raises(DataError, match=r"\.mp4 is h264; DALI decodes only VP8, VP9 and MJPEG on the CPU.*"
                                        r"Re-encode it to VP9: python -m crossdali\.video\.reencode"):
        create_video_loader(tiny_video / "h264", train=True, backend="dali-cpu")


def test_file_shorter_than_a_clip(tmp_path):
    from crossdali.common.data.sample_data.video import write_video
    from crossdali.common.data.videos import check_videos
    from crossdali.common.errors import DataError
    from crossdali.common.video import ClipTransform

    write_video(tmp_path / "short.webm", _frames(10))
    with pytest.raises(DataError, match=r"short\.webm has 10 frames but a clip needs 16"):
        check_videos([str(tmp_path / "short.webm")], device="cpu", transform=ClipTransform(sequence_length=8, stride=2))


def test_optical_flow_without_gpu_says_what_hardware_is_needed(tiny_video):
    from crossdali.common.classification import PipelineOptions
    from crossdali.common.optical_flow import OpticalFlowUnavailable, create_optical_flow_pipeline
    from crossdali.common.video import resolve_video_source

    files = resolve_video_source(tiny_video, "val").files
    with pytest.raises(OpticalFlowUnavailable,
                       match=r"optical-flow engine of an NVIDIA GPU of the Turing generation or newer.*no CPU"):
        create_optical_flow_pipeline(files, options=PipelineOptions(batch_size=1))


def test_optical_flow_example_fails_clearly_without_gpu(tiny_video, tmp_path):
    from nvidia.dali.backend import GetCUDADeviceCount

    from crossdali.common.optical_flow import OpticalFlowUnavailable

    if GetCUDADeviceCount() > 0:
        pytest.skip("a CUDA GPU is visible: the GPU test covers the example")
    from crossdali.video.optical_flow import get_args_parser, main

    args = get_args_parser().parse_args(["--data", str(tiny_video), "--output-dir", str(tmp_path)])
    with pytest.raises(OpticalFlowUnavailable, match=r"this machine shows 0 CUDA GPU"):
        main(args)


def test_vp9_below_nvdec_minimum_on_gpu_names_file_and_fix(tiny_video):
    """64x64 VP9 decodes on the CPU, but NVDEC rejects VP9 under 128x128 mid-epoch: say so up front."""
    from crossdali.common.data.videos import check_videos
    from crossdali.common.errors import DataError

    files = sorted(str(p) for p in tiny_video.rglob("*.webm"))[:2]
    assert check_videos(files, device="cpu")  # fine on the CPU
    with pytest.raises(DataError, match=r"\.webm is 64x64 vp9; the GPU's NVDEC decodes vp9 from 128x128 up\. "
                                        r"Upscale it, e\.g\. `ffmpeg .*--data-backend dali-cpu"):
        check_videos(files, device="gpu")
