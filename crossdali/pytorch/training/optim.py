"""The optimiser and the learning-rate schedule of every PyTorch training script (``--opt``, ``--lr``,
``--lr-warmup-epochs``)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from crossdali.common.errors import UsageError

__all__ = ["scaled_lr", "create_optimizer", "create_scheduler"]


def scaled_lr(lr: float, *, batch_size: int, world_size: int, reference_batch: int | None) -> float:
    """``lr`` given for a global batch of ``reference_batch``, scaled linearly to this job's global batch."""
    return lr if reference_batch is None else lr * batch_size * world_size / reference_batch



def create_optimizer(name: str, params: Iterable, *, lr: float, momentum: float = 0.9,
                     weight_decay: float = 0.0, fused: bool | None = None) -> torch.optim.Optimizer:
    """``sgd`` (with momentum) or ``adamw`` by name (``--opt``); PyTorch's fused implementation when
    the parameters are on a CUDA GPU: with it, ``GradScaler`` hands the inf/NaN check to the optimizer's
    kernel instead of reading it on the host every step, so the host is not held back by the GPU
    (docs/benchmarks.md#training-speed). ``fused``: force it on or off (default: on for CUDA parameters)."""
    params = list(params)
    if fused is None:
        fused = bool(params) and all(isinstance(p, torch.Tensor) and p.is_cuda for p in params)
    if name == "sgd":
        optimizer = torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, fused=fused or None)
        if fused and momentum:
            # PyTorch 2.11's fused SGD creates its momentum buffers uninitialised on its first step and
            # fills them in the kernel, which GradScaler skips while the gradients overflow (the first
            # steps of every AMP run): the garbage stays and the weights turn NaN within a few steps.
            # Zeros first are the same arithmetic: buffer = momentum * 0 + gradient.
            for p in params:
                optimizer.state[p]["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return optimizer
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused or None)
    raise UsageError(f"--opt must be sgd or adamw, got {name!r}")



def create_scheduler(optimizer: torch.optim.Optimizer, *, epochs: int, steps_per_epoch: int, warmup_epochs: float,
                     start_factor: float = 0.1) -> torch.optim.lr_scheduler.LambdaLR:
    """Per-step linear warm-up from ``start_factor * lr`` over ``warmup_epochs``, then cosine decay to 0.

    A closed form of the step number (``LambdaLR``): its saved state is the step count alone, so a
    resumed run continues the very same learning rates, and a run resumed with more ``--epochs``
    continues on the longer schedule.
    """
    total = max(1, epochs * steps_per_epoch)
    warmup = min(int(warmup_epochs * steps_per_epoch), total - 1)

    def factor(step: int) -> float:
        if step < warmup:
            return start_factor + (1.0 - start_factor) * step / warmup
        return 0.5 * (1.0 + math.cos(math.pi * min(step - warmup, total - warmup) / (total - warmup)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
