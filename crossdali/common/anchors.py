"""SSD300's 8,732 default boxes (anchors), as in the SSD paper and NVIDIA's SSD300 v1.1.

Six feature maps (38, 19, 10, 5, 3, 1 cells) with 4 or 6 boxes per cell: a square of scale
``s_k``, a square of scale ``sqrt(s_k * s_{k+1})``, and ``s_k`` at aspect ratios 2, 1/2 (and
3, 1/3 on the middle maps). Framework-free numpy, shared by DALI's ``box_encoder`` (which takes
them as a flat ltrb list) and the model's decoder, so both use the very same boxes.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

__all__ = ["DefaultBoxes", "ssd300_default_boxes", "BOX_CODER_STDS"]

#: Scales of the (x, y, w, h) regression targets: offsets are divided by these (SSD's "variances").
BOX_CODER_STDS = (0.1, 0.1, 0.2, 0.2)


@dataclass(frozen=True)
class DefaultBoxes:
    """Default boxes of one SSD head layout, relative to the image (0..1)."""

    fig_size: int
    feat_size: tuple[int, ...]
    steps: tuple[int, ...]
    scales: tuple[int, ...]
    aspect_ratios: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        n = len(self.feat_size)
        if not (len(self.steps) == n and len(self.aspect_ratios) == n and len(self.scales) == n + 1):
            raise ValueError("feat_size, steps and aspect_ratios need one entry per feature map, scales one more")

    @property
    def boxes_per_cell(self) -> tuple[int, ...]:
        return tuple(2 + 2 * len(a) for a in self.aspect_ratios)

    def xywh(self) -> np.ndarray:
        """``(num_boxes, 4)`` float32 centre x, centre y, width, height, clipped to [0, 1]."""
        out = []
        for idx, sfeat in enumerate(self.feat_size):
            sk1 = self.scales[idx] / self.fig_size
            sk2 = self.scales[idx + 1] / self.fig_size
            sk3 = math.sqrt(sk1 * sk2)
            sizes = [(sk1, sk1), (sk3, sk3)]
            for alpha in self.aspect_ratios[idx]:
                w, h = sk1 * math.sqrt(alpha), sk1 / math.sqrt(alpha)
                sizes += [(w, h), (h, w)]
            fk = self.fig_size / self.steps[idx]
            for w, h in sizes:
                for i, j in itertools.product(range(sfeat), repeat=2):
                    out.append(((j + 0.5) / fk, (i + 0.5) / fk, w, h))
        # order: per map, per box shape, per cell (row-major): the SSD head's flatten order
        return np.clip(np.asarray(out, dtype=np.float32), 0.0, 1.0)

    def ltrb(self) -> np.ndarray:
        """``(num_boxes, 4)`` float32 left, top, right, bottom."""
        b = self.xywh()
        return np.concatenate([b[:, :2] - b[:, 2:] / 2, b[:, :2] + b[:, 2:] / 2], axis=1)

    def __len__(self) -> int:
        return sum(f * f * n for f, n in zip(self.feat_size, self.boxes_per_cell))


def ssd300_default_boxes() -> DefaultBoxes:
    """The SSD300 layout on COCO: 8,732 boxes over 38/19/10/5/3/1 feature maps."""
    return DefaultBoxes(fig_size=300, feat_size=(38, 19, 10, 5, 3, 1), steps=(8, 16, 32, 64, 100, 300),
                        scales=(21, 45, 99, 153, 207, 261, 315), aspect_ratios=((2,), (2, 3), (2, 3), (2, 3), (2,), (2,)))
