"""``crossdali check``: find bad data before training, because DALI cannot skip a bad sample.

Two depths: ``fast`` reads every sample's bytes without decoding their pixels (formats, headers,
sizes against a limit, JPEG/PNG structure, each JPEG's image data decoded by libjpeg-turbo at 1/8
scale with its warnings as errors, record indexes against their records, COCO annotations against
the images, video containers); ``full`` also decodes every sample with DALI (on the GPU
when there is one) and counts the decoder's warnings as errors. Results are cached by path, size
and mtime. The report lists every bad sample; its exclusion list is accepted by every loader
(``exclude=``) and script (``--exclude FILE``). The names below are imported on first use: the
building blocks (``core``, ``exclude``, ``records``) sit under ``crossdali.common.data.sources``,
while ``report`` checks whole datasets through it, so importing the package loads neither.
"""

from __future__ import annotations

import importlib

__all__ = ["CheckSettings", "Exclusions", "Problem", "Report", "check_before_training", "check_data",
           "load_exclusions"]

_WHERE = {
    "CheckSettings": "crossdali.common.data.check.core",
    "Problem": "crossdali.common.data.check.core",
    "Exclusions": "crossdali.common.data.check.exclude",
    "load_exclusions": "crossdali.common.data.check.exclude",
    "Report": "crossdali.common.data.check.report",
    "check_data": "crossdali.common.data.check.report",
    "check_before_training": "crossdali.common.data.check.report",
}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
