"""torchvision presets that mirror crossdali's DALI classification preset (the native baseline).

They are *not* used by the DALI backends: they exist so the benchmark and the parity tests can
compare DALI with what a PyTorch user runs today. Same sizes, ranges, mean and std as
``crossdali.common.classification.ClassificationTransform``.
"""

from __future__ import annotations

import torch
from torchvision.transforms import v2

from crossdali.common.classification import ClassificationTransform

__all__ = ["ClassificationPresetTrain", "ClassificationPresetEval"]


def _normalize(t: ClassificationTransform):
    """To [0, 1] floats, normalized in float32, then the preset's ``dtype`` (float16 rounds the result once,
    as DALI's CPU crop_mirror_normalize does; its GPU kernel's float16 can differ by a float16 step or two)."""
    steps = [
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(mean=[m / 255 for m in t.mean], std=[s / 255 for s in t.std]),
    ]
    return steps + ([v2.ToDtype(torch.float16)] if t.dtype == "float16" else [])


class ClassificationPresetTrain:
    """RandomResizedCrop (antialiased) + horizontal flip + normalize, on a uint8 CHW tensor or PIL image."""

    def __init__(self, *, transform: ClassificationTransform | None = None) -> None:
        t = transform or ClassificationTransform()
        self.transforms = v2.Compose([
            v2.ToImage(),
            v2.RandomResizedCrop(t.crop_size, scale=t.random_area, ratio=t.random_aspect_ratio, antialias=True),
            v2.RandomHorizontalFlip(0.5),
            *_normalize(t),
        ])

    def __call__(self, img):
        return self.transforms(img)


class ClassificationPresetEval:
    """Resize shorter side (antialiased bilinear) + centre crop + normalize."""

    def __init__(self, *, transform: ClassificationTransform | None = None) -> None:
        t = transform or ClassificationTransform()
        self.transforms = v2.Compose([
            v2.ToImage(),
            v2.Resize(t.val_resize_size, interpolation=v2.InterpolationMode.BILINEAR, antialias=True),
            v2.CenterCrop(t.crop_size),
            *_normalize(t),
        ])

    def __call__(self, img):
        return self.transforms(img)
