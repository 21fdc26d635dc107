"""Mixed precision (``--amp``): autocast, and the optimizer step with loss scaling where float16 needs it."""

from __future__ import annotations

import torch

from crossdali.pytorch.distributed import Runtime

__all__ = ["MixedPrecision"]


class MixedPrecision:
    """Autocast and the optimizer step with loss scaling.

    ``enabled``: float16 on CUDA, bfloat16 on the CPU (``dtype`` overrides). float16 gradients
    underflow (below 6e-8 they become 0), so whenever the dtype is float16 the loss is scaled
    by a ``GradScaler`` before ``backward`` and the gradients unscaled before the step; bfloat16 has
    float32's range and needs no scaling. Under Horovod the scaler must see the averaged gradients:
    ``synchronize()`` first, then step without a second allreduce (``skip_synchronize``).
    """

    def __init__(self, *, enabled: bool, runtime: Runtime, dtype: torch.dtype | None = None) -> None:
        self.device_type = runtime.device.type
        self.dtype = (dtype or (torch.float16 if self.device_type == "cuda" else torch.bfloat16)) if enabled else None
        self.horovod = runtime.engine == "horovod"
        self.scaler = torch.amp.GradScaler(self.device_type, enabled=self.dtype == torch.float16)

    def autocast(self, *, cache: bool = True) -> torch.autocast:
        """``cache=False`` for a CUDA graph capture (``graph_model``): autocast's cache of cast weights
        would be captured as if the weights never changed."""
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.dtype is not None, cache_enabled=cache)

    def backward_step(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        """Zero the gradients, backward the (scaled) loss, step the optimizer, update the scale."""
        optimizer.zero_grad()  # set_to_none by default; Horovod's DistributedOptimizer takes no arguments
        self.scaler.scale(loss).backward()
        if self.horovod and self.scaler.is_enabled():
            optimizer.synchronize()  # finish Horovod's allreduce before the scaler reads the gradients
            self.scaler.unscale_(optimizer)
            with optimizer.skip_synchronize():
                self.scaler.step(optimizer)
        else:
            self.scaler.step(optimizer)
        self.scaler.update()
