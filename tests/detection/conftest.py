"""A small detection sample set shared by the detection tests (built once per session)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest


@pytest.fixture(scope="session")
def detection_root(tmp_path_factory) -> Path:
    """The ``tiny`` detection sample set (96 train / 24 val JPEGs), under $CROSSDALI_DATA if set."""
    from crossdali.common.data.sample_data.detection import ensure_detection

    root = os.environ.get("CROSSDALI_DATA")
    return ensure_detection(Path(root) if root else tmp_path_factory.mktemp("data"), "tiny")


@pytest.fixture(scope="session")
def mini_detection(tmp_path_factory) -> Path:
    """16 train / 8 val small images with large objects: enough for a CPU training run of a few steps."""
    from crossdali.common.data.sample_data.detection import DetectionSampleConfig, build_detection

    root = os.environ.get("CROSSDALI_DATA")
    root = Path(root) / "ci-mini" if root else tmp_path_factory.mktemp("mini")
    cfg = DetectionSampleConfig(train_images=16, val_images=8, min_side=128, max_side=160, max_objects=3,
                                min_object=0.3, max_object=0.6)
    return build_detection(root, cfg)


@pytest.fixture(scope="session")
def expected_crop_boxes():
    """The train pipeline's box geometry written independently in numpy (paste, centre-in-window
    crop, clip, flip), from the random parameters the pipeline exposes with ``debug=True``."""
    return _expected_crop_boxes


def _expected_crop_boxes(raw, ratio, px, py, anchor, shape, flip):
    """The train pipeline's box geometry, written independently: paste, centre-in-window crop, flip."""
    b = raw.astype(np.float64)
    b = b / ratio + np.array([px, py, px, py]) * (1 - 1 / ratio)  # zoom-out: canvas = ratio x image
    centre = (b[:, :2] + b[:, 2:]) / 2
    lo, hi = anchor, anchor + shape
    keep = np.all((centre >= lo) & (centre <= hi), axis=1)
    b = b[keep]
    b = (np.clip(b, np.tile(lo, 2), np.tile(hi, 2)) - np.tile(lo, 2)) / np.tile(shape, 2)
    if flip:
        b = np.stack([1 - b[:, 2], b[:, 1], 1 - b[:, 0], b[:, 3]], axis=1)
    return b, keep
