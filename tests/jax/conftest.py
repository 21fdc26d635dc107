"""Fixtures for the JAX tests: the video and detection sample sets (the same builders, and so the
same files, as tests/video and tests/detection use), and JAX's GPU memory policy."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# JAX grabs 75 % of a GPU's memory when its backend starts; the GPU tests also run DALI's decoders
# and PyTorch in the same process. Set before any test starts JAX's backend.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


@pytest.fixture(scope="session", autouse=True)
def jax_compilation_cache(tmp_path_factory):
    """One persistent XLA compilation cache for the session: the training tests call ``main()``
    several times, and each call jits the same programs anew (new closures); the cache serves
    the compiled code from the first (compilation dominates these runs on 2 cores)."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_compilation_cache_dir", str(tmp_path_factory.mktemp("xla-cache")))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@pytest.fixture(scope="session")
def tiny_video(data_root) -> Path:
    """80 train / 20 val VP9 clips of 32 frames, 64x64, 4 motion classes."""
    pytest.importorskip("av", reason="the video sample set is encoded with PyAV: pip install av")
    from crossdali.common.data.sample_data import BUILDERS

    return BUILDERS["video"](data_root, "tiny")


@pytest.fixture(scope="session")
def gpu_video(data_root) -> Path:
    """20 train / 20 val clips at 128x128: the smallest VP9 frame NVDEC decodes."""
    pytest.importorskip("av", reason="the video sample set is encoded with PyAV: pip install av")
    from crossdali.common.data.sample_data import BUILDERS

    return BUILDERS["video"](data_root, "gpu-tiny")


@pytest.fixture(scope="session")
def detection_root(data_root) -> Path:
    """The ``tiny`` detection sample set (96 train / 24 val JPEGs)."""
    from crossdali.common.data.sample_data.detection import ensure_detection

    return ensure_detection(data_root, "tiny")
