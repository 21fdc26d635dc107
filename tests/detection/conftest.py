"""A small detection sample set shared by the detection tests (built once per session)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def detection_root(tmp_path_factory) -> Path:
    """The ``tiny`` detection sample set (96 train / 24 val JPEGs), under $CROSSDALI_DATA if set."""
    from crossdali.common.sample_data.detection import ensure_detection

    root = os.environ.get("CROSSDALI_DATA")
    return ensure_detection(Path(root) if root else tmp_path_factory.mktemp("data"), "tiny")
