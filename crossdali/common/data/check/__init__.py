"""``crossdali check``: find bad data before training, because DALI cannot skip a bad sample.

Two depths: ``fast`` reads every sample's bytes without decoding them (formats, headers, sizes
against a limit, JPEG/PNG structure, record indexes against their records, COCO annotations
against the images, video containers); ``full`` also decodes every sample with DALI (on the GPU
when there is one) and counts the decoder's warnings as errors. Results are cached by path, size
and mtime. The report lists every bad sample; its exclusion list is accepted by every loader
(``exclude=``) and script (``--exclude FILE``). Submodules are imported on first use, so
``crossdali.common.sources`` can use the exclusion list without a circular import.
"""

from __future__ import annotations

import importlib

__all__ = ["CheckSettings", "Exclusions", "Problem", "Report", "check_before_training", "check_data",
           "load_exclusions"]

_WHERE = {
    "CheckSettings": "crossdali.common.check.core",
    "Problem": "crossdali.common.check.core",
    "Exclusions": "crossdali.common.check.exclude",
    "load_exclusions": "crossdali.common.check.exclude",
    "Report": "crossdali.common.check.report",
    "check_data": "crossdali.common.check.report",
    "check_before_training": "crossdali.common.check.report",
}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
