"""Embedded sample datasets in real formats, cut from real photos (no download needed).

``python -m crossdali.common.data.sample_data --help`` (or ``crossdali make-data``) builds them.
"""

from __future__ import annotations

import os
from pathlib import Path

from crossdali.common.data.sample_data.classification import (
    SIZES,
    ClassificationSampleConfig,
    build_classification,
    class_names,
)
from crossdali.common.data.sample_data.detection import ensure_detection
from crossdali.common.data.sample_data.multilabel import MULTILABEL_SIZES, build_multilabel
from crossdali.common.data.sample_data.video import ensure_video

__all__ = [
    "SIZES",
    "ClassificationSampleConfig",
    "build_classification",
    "class_names",
    "default_root",
    "ensure_classification",
    "ensure_detection",
    "ensure_multilabel",
    "BUILDERS",
]


def default_root() -> Path:
    """Where sample data lives: ``$CROSSDALI_DATA`` or ``~/.cache/crossdali``."""
    env = os.environ.get("CROSSDALI_DATA")
    return Path(env) if env else Path.home() / ".cache" / "crossdali"


def ensure_classification(root: Path | None = None, size: str = "small", *,
                          formats: tuple[str, ...] = ("imagefolder", "tfrecord", "recordio", "webdataset")) -> Path:
    """Build the classification sample set of the named ``size`` if missing; return its folder.

    Each size gets its own sub-folder, so a ``bench`` build does not replace the ``small`` one.
    """
    if size not in SIZES:
        raise ValueError(f"unknown sample size {size!r}; choose one of {sorted(SIZES)}")
    root = Path(root) if root is not None else default_root()
    return build_classification(root / size, SIZES[size], formats=formats)


def ensure_multilabel(root: Path | None = None, size: str = "small") -> Path:
    """Build the multi-label sample set (grids of 1-3 class photos) of the named ``size`` if missing."""
    if size not in MULTILABEL_SIZES:
        raise ValueError(f"unknown sample size {size!r}; choose one of {sorted(MULTILABEL_SIZES)}")
    root = Path(root) if root is not None else default_root()
    return build_multilabel(root / size, MULTILABEL_SIZES[size])


#: kind -> builder(root, size) -> folder. ``make-data --kind`` chooses among these.
BUILDERS = {"classification": ensure_classification, "detection": ensure_detection, "video": ensure_video,
            "multilabel": ensure_multilabel}
