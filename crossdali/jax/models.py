"""Image classifiers in flax linen for the JAX training example: ResNet-18/50 and a 4-layer CNN.

Written here because no maintained package ships flax ResNets with random initialisation and a
plain ``(x, train=...)`` call (flax's own ResNet lives in its ``examples/imagenet`` folder, which
is not installed with flax); this follows that example's structure. Inputs are NHWC.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import flax.linen as nn
import jax.numpy as jnp

from crossdali.common.models import builder_name

__all__ = ["ARCHS", "ResNet", "SmallCNN", "create_model"]


class SmallCNN(nn.Module):
    """Four stride-2 conv + batch-norm + ReLU layers, global average pool, linear: for fast CPU tests."""

    num_classes: int
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x, *, train: bool):
        for width in (32, 64, 128, 256):
            x = nn.Conv(width, (3, 3), strides=(2, 2), padding="SAME", use_bias=False, dtype=self.dtype)(x)
            x = nn.BatchNorm(use_running_average=not train, momentum=0.9, dtype=self.dtype)(x)
            x = nn.relu(x)
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.num_classes, dtype=jnp.float32)(x)


class ResNetBlock(nn.Module):
    """Basic block (two 3x3 convolutions), ResNet-18/34."""

    filters: int
    conv: Callable
    norm: Callable
    strides: tuple[int, int] = (1, 1)

    @nn.compact
    def __call__(self, x):
        residual = x
        y = nn.relu(self.norm()(self.conv(self.filters, (3, 3), self.strides)(x)))
        y = self.norm(scale_init=nn.initializers.zeros)(self.conv(self.filters, (3, 3))(y))  # zero-init last BN
        if residual.shape != y.shape:
            residual = self.norm()(self.conv(self.filters, (1, 1), self.strides)(residual))
        return nn.relu(residual + y)


class BottleneckResNetBlock(nn.Module):
    """Bottleneck block (1x1, 3x3 with the stride, 1x1 x4), ResNet-50 and deeper."""

    filters: int
    conv: Callable
    norm: Callable
    strides: tuple[int, int] = (1, 1)

    @nn.compact
    def __call__(self, x):
        residual = x
        y = nn.relu(self.norm()(self.conv(self.filters, (1, 1))(x)))
        y = nn.relu(self.norm()(self.conv(self.filters, (3, 3), self.strides)(y)))
        y = self.norm(scale_init=nn.initializers.zeros)(self.conv(self.filters * 4, (1, 1))(y))
        if residual.shape != y.shape:
            residual = self.norm()(self.conv(self.filters * 4, (1, 1), self.strides)(residual))
        return nn.relu(residual + y)


class ResNet(nn.Module):
    """ResNet v1.5 (stride in the 3x3 convolution), as torchvision's and flax's ImageNet example."""

    stage_sizes: Sequence[int]
    block_cls: type[nn.Module]
    num_classes: int
    num_filters: int = 64
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x, *, train: bool):
        conv = partial(nn.Conv, use_bias=False, dtype=self.dtype, padding="SAME",
                       kernel_init=nn.initializers.variance_scaling(2.0, "fan_out", "normal"))
        norm = partial(nn.BatchNorm, use_running_average=not train, momentum=0.9, epsilon=1e-5, dtype=self.dtype)
        x = nn.relu(norm()(conv(self.num_filters, (7, 7), (2, 2), padding=[(3, 3), (3, 3)])(x)))
        x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
        for i, size in enumerate(self.stage_sizes):
            for j in range(size):
                strides = (2, 2) if i > 0 and j == 0 else (1, 1)
                x = self.block_cls(self.num_filters * 2**i, conv=conv, norm=norm, strides=strides)(x)
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.num_classes, dtype=jnp.float32)(x)


ARCHS: dict[str, Callable[..., nn.Module]] = {
    "resnet18": partial(ResNet, stage_sizes=(2, 2, 2, 2), block_cls=ResNetBlock),
    "resnet34": partial(ResNet, stage_sizes=(3, 4, 6, 3), block_cls=ResNetBlock),
    "resnet50": partial(ResNet, stage_sizes=(3, 4, 6, 3), block_cls=BottleneckResNetBlock),
    "small_cnn": SmallCNN,
}


def create_model(arch: str, *, num_classes: int, dtype: jnp.dtype = jnp.float32) -> nn.Module:
    """A flax module by name: a name of ``crossdali.common.models`` that JAX has (``ARCHS``; another
    is a ``ModelNameError`` naming the frameworks that have it); ``dtype`` is the compute type
    (bfloat16 for mixed precision)."""
    return ARCHS[builder_name(arch, "jax")](num_classes=num_classes, dtype=dtype)
