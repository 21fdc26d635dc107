"""Video classifiers: a small 3D CNN that trains on a CPU in minutes, or torchvision's video
ResNets (``r2plus1d_18``, ``r3d_18``, ``mc3_18``, random init) for real datasets."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["ARCHS", "Small3DCNN", "create_video_model"]

ARCHS = ("small3d", "r2plus1d_18", "r3d_18", "mc3_18")


def _block(cin: int, cout: int, stride: tuple[int, int, int]) -> nn.Sequential:
    return nn.Sequential(nn.Conv3d(cin, cout, 3, stride=stride, padding=1, bias=False),
                         nn.BatchNorm3d(cout), nn.ReLU(inplace=True))


class Small3DCNN(nn.Module):
    """Four 3x3x3 conv blocks (first keeps time, the rest halve it) and a linear head, on
    ``(N, C, F, H, W)`` clips. About 0.2 M parameters."""

    def __init__(self, num_classes: int, width: int = 16) -> None:
        super().__init__()
        self.features = nn.Sequential(
            _block(3, width, (1, 2, 2)),
            _block(width, 2 * width, (2, 2, 2)),
            _block(2 * width, 4 * width, (2, 2, 2)),
            _block(4 * width, 4 * width, (1, 1, 1)),
            nn.AdaptiveAvgPool3d(1),
        )
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def create_video_model(arch: str, *, num_classes: int) -> nn.Module:
    """A randomly initialised video classifier by name (see ``ARCHS``)."""
    if arch == "small3d":
        return Small3DCNN(num_classes)
    if arch in ARCHS:
        import torchvision

        return torchvision.models.get_model(arch, weights=None, num_classes=num_classes)
    raise ValueError(f"--arch must be one of {ARCHS}, got {arch!r}")
