"""How many hardware work queues CUDA gives a process whose GPU DALI shares with a framework.

CUDA maps a process's streams onto ``CUDA_DEVICE_MAX_CONNECTIONS`` hardware queues (8 unless set).
A ``dali-gpu`` pipeline runs on about 16 streams (nvJPEG's, the resize's, the copies'), so some of
them share a queue with the model's stream and wait behind its kernels even when SMs are free: DALI
then falls behind a model that keeps the GPU busy. Measured on one H100 (``python -m
benchmarks.classification_loaders --cuda-queues 32|unset --skip-loader --train-loop scaler,fused ...``,
phase ``trainfix`` of ``benchmarks/gpu_session.sh``; results/classification/train_fix_queues_*): ResNet-50
AMP fed by ``dali-gpu`` with fused SGD trained at 93.2 % of synthetic-data speed with 8 queues and
97.0 % with 32 (data wait 15-16 % of the step -> 1.5-1.8 %); with plain SGD 89.8 % -> 94.3 %. JAX's
script (flax ResNet-50 bfloat16, phase ``trainjax8``): 84.3 % with 8, 97.4 % with 32.

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
            f"fall behind it; `export {VARIABLE}={QUEUES}` before the script starts CUDA (measured on an H100: "
            "ResNet-50 training 93 % -> 97 % of synthetic-data speed; crossdali's training scripts set it)")
