"""How many hardware work queues CUDA gives a process whose GPU DALI shares with a framework.

CUDA maps a process's streams onto ``CUDA_DEVICE_MAX_CONNECTIONS`` hardware queues (8 unless set).
A ``dali-gpu`` pipeline runs on about 16 streams (nvJPEG's, the resize's, the copies'), so some of
them share a queue with the model's stream and wait behind its kernels even when SMs are free: DALI
then falls behind a model that keeps the GPU busy. With 32 queues each stream has its own, and the
data wait of ResNet-50 training fed by ``dali-gpu`` nearly vanishes, in PyTorch and JAX alike
(docs/benchmarks.md#training-speed; ``python -m benchmarks.classification_loaders --cuda-queues 32|unset``
reruns the comparison).

CUDA reads the variable when it creates its context, so it must be set before the first CUDA call.
Nothing here imports a framework.
"""

from __future__ import annotations

import logging
import os

__all__ = ["VARIABLE", "QUEUES", "share_gpu_with_dali", "queues_hint"]

log = logging.getLogger(__name__)

VARIABLE = "CUDA_DEVICE_MAX_CONNECTIONS"
#: CUDA's maximum: a queue for every DALI stream and the framework's
QUEUES = 32


def share_gpu_with_dali(queues: int = QUEUES) -> str:
    """Set ``CUDA_DEVICE_MAX_CONNECTIONS`` to ``queues`` (1-32) unless the user set it (a user's value
    wins: some libraries need 1 to order communication before computation); the value in effect. Call
    it before anything starts CUDA (the training scripts do, first thing)."""
    if not 1 <= queues <= QUEUES:
        raise ValueError(f"CUDA has 1 to {QUEUES} hardware queues, not {queues}")
    return os.environ.setdefault(VARIABLE, str(queues))


def queues_hint() -> str | None:
    """One line for a ``dali-gpu`` user whose process left the variable unset, else None."""
    if os.environ.get(VARIABLE):
        return None
    return (f"{VARIABLE} is unset, so DALI's GPU streams share CUDA's 8 hardware queues with the model's and can "
            f"fall behind it; `export {VARIABLE}={QUEUES}` before the script starts CUDA (docs/benchmarks.md#training-speed; "
            "crossdali's training scripts set it)")
