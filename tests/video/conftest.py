"""Fixtures for the video tests: the ``tiny`` video sample set (built once per data root)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_video(data_root) -> Path:
    """80 train / 20 val VP9 clips of 32 frames, 64x64, 4 motion classes; H.264 copies; index videos."""
    pytest.importorskip("av", reason="the video sample set is encoded with PyAV: pip install av")
    from crossdali.common.data.sample_data import BUILDERS

    return BUILDERS["video"](data_root, "tiny")


@pytest.fixture(scope="session")
def gpu_video(data_root) -> Path:
    """20 train / 20 val clips at 128x128: the smallest VP9 frame NVDEC decodes (the tiny set is 64x64)."""
    pytest.importorskip("av", reason="the video sample set is encoded with PyAV: pip install av")
    from crossdali.common.data.sample_data import BUILDERS

    return BUILDERS["video"](data_root, "gpu-tiny")


@pytest.fixture(scope="session")
def indexed_val_clips(tiny_video):
    """19 val files (an odd clip count: 8-frame clips, stride 2, step 8) labelled by their index, and
    ``{(file index, first frame): clip id}``, so a loader's (label, frame_num) names each clip."""
    pytest.importorskip("torch")
    from crossdali.common.data.sources import DataSource
    from crossdali.common.data.videos import check_videos
    from crossdali.common.video import ClipTransform, resolve_video_source

    val = resolve_video_source(tiny_video, "val")
    files = val.files[:-1]
    src = DataSource(format="filelist", root=val.root, files=files, labels=tuple(range(len(files))),
                     num_samples=len(files))
    t = ClipTransform(sequence_length=8, stride=2, step=8)
    ids = {}
    for i, info in enumerate(check_videos(files, device="cpu")):
        for s in range(0, info.num_frames - t.frames_needed + 1, t.clip_step):
            ids[(i, s)] = len(ids)
    assert len(ids) % 2 == 1
    return src, ids
