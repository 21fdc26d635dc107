"""PyTorch classifiers by ``--arch`` name (``crossdali.common.models``): torchvision's models, with
random weights, and ``small_cnn``, a 4-layer net for fast CPU tests (the same design as the
TensorFlow, JAX and MXNet scripts' ``small_cnn``).
"""

from __future__ import annotations

import torch
from torch import nn

from crossdali.common.models import builder_name

__all__ = ["SmallCNN", "create_model"]


class SmallCNN(nn.Sequential):
    """Four stride-2 conv + batch-norm + ReLU layers, global average pool, linear.

    Args:
        num_classes: outputs of the last layer.
    """

    def __init__(self, num_classes: int) -> None:
        layers: list[nn.Module] = []
        width_in = 3
        for width in (32, 64, 128, 256):
            layers += [nn.Conv2d(width_in, width, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(width),
                       nn.ReLU(inplace=True)]
            width_in = width
        super().__init__(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width_in, num_classes))


def create_model(arch: str, *, num_classes: int) -> torch.nn.Module:
    """A classifier with random weights.

    Args:
        arch: a name of ``crossdali.common.models.MODELS`` (or an alias) that PyTorch has;
            ``ModelNameError`` otherwise.
        num_classes: outputs of the classifier.
    """
    name = builder_name(arch, "pytorch")
    if name == "small_cnn":
        return SmallCNN(num_classes)
    import torchvision  # defer: small_cnn needs only torch

    return torchvision.models.get_model(name, weights=None, num_classes=num_classes)
