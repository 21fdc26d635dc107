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


@pytest.fixture(scope="session")
def check_image_placement():
    """Runs the train pipeline without colour jitter or flip and checks its pixels against the random
    parameters: the fill colour outside the image's place in the crop window (1 px of slack at its
    edges), the photo inside."""
    return _check_image_placement


def _check_image_placement(root: Path, options, batches: int = 4) -> None:
    from crossdali.common.detection import (
        DEBUG_OUTPUTS,
        TRAIN_OUTPUTS,
        DetectionTransform,
        create_detection_pipeline,
        resolve_detection_source,
    )

    same = (1.0, 1.0 + 1e-6)  # no colour jitter (DALI's uniform needs a non-empty range)
    t = DetectionTransform(hue_degrees=1e-6, saturation=same, brightness=same, contrast=same, flip_probability=0.0)
    fill = (np.array(t.fill, np.float64) - t.mean) / t.std
    pipe = create_detection_pipeline(resolve_detection_source(root, "train"), train=True, options=options,
                                     transform=t, debug=True)
    pipe.build()
    names = TRAIN_OUTPUTS + DEBUG_OUTPUTS
    zoomed = 0
    ys, xs = np.mgrid[0:t.size, 0:t.size] + 0.5
    for _ in range(batches):
        out = {n: x.as_cpu() if hasattr(x, "as_cpu") else x for n, x in zip(names, pipe.run())}
        for i in range(len(out["images"])):
            img = np.array(out["images"][i])
            ratio, px, py = (float(np.array(out[k][i])) for k in ("ratio", "paste_x", "paste_y"))
            anchor, shape = np.array(out["crop_anchor"][i], np.float64), np.array(out["crop_shape"][i], np.float64)
            lo = (np.array([px, py]) * (1 - 1 / ratio) - anchor) / shape * t.size  # the image's corners in the output
            hi = lo + t.size / ratio / shape
            is_fill = np.all(np.abs(img - fill[:, None, None]) < 1e-3, axis=0)  # (H, W)
            outside = (xs < lo[0] - 1) | (xs > hi[0] + 1) | (ys < lo[1] - 1) | (ys > hi[1] + 1)
            inside = (xs > lo[0] + 1) & (xs < hi[0] - 1) & (ys > lo[1] + 1) & (ys < hi[1] - 1)
            assert is_fill[outside].all(), f"sample {i}: photo pixels outside the image's place"
            if inside.sum() > 100:
                assert is_fill[inside].mean() < 0.5, f"sample {i}: fill colour where the photo should be"
            zoomed += ratio > 1.5 and outside.any()
    assert zoomed > 0
