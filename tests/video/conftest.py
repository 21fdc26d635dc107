"""Fixtures for the video tests: the ``tiny`` video sample set (built once per data root)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_video(data_root) -> Path:
    """80 train / 20 val VP9 clips of 32 frames, 64x64, 4 motion classes; H.264 copies; index videos."""
    pytest.importorskip("av", reason="the video sample set is encoded with PyAV: pip install av")
    from crossdali.common.sample_data import BUILDERS

    return BUILDERS["video"](data_root, "tiny")


@pytest.fixture(scope="session")
def gpu_video(data_root) -> Path:
    """20 train / 20 val clips at 128x128: the smallest VP9 frame NVDEC decodes (the tiny set is 64x64)."""
    pytest.importorskip("av", reason="the video sample set is encoded with PyAV: pip install av")
    from crossdali.common.sample_data import BUILDERS

    return BUILDERS["video"](data_root, "gpu-tiny")
