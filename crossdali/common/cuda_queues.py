"""How many hardware work queues CUDA gives a process whose GPU DALI shares with a framework.

CUDA maps a process's streams onto ``CUDA_DEVICE_MAX_CONNECTIONS`` hardware queues (8 unless set).
A ``dali-gpu`` pipeline runs on about 16 streams (nvJPEG's, the resize's, the copies'), so some of
them share a queue with the model's stream and wait behind its kernels even when SMs are free: DALI
then falls behind a model that keeps the GPU busy. Measured on one H100 (``python -m
benchmarks.classification_loaders --skip-loader --train-loop fused,lookahead ...``, phase
``trainknobs`` of ``benchmarks/gpu_session.sh``; results/classification/train_knobs_conn_*): ResNet-50
AMP fed by ``dali-gpu`` trained at 94.4 % of synthetic-data speed with 8 queues, 97.1 % with 32,
and the data wait fell from 18-26 % of the step to 1.6-1.7 %.

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


def share_gpu_with_dali() -> str:
    """Set ``CUDA_DEVICE_MAX_CONNECTIONS`` to 32 unless the user set it (a user's value wins: some
    libraries need 1 to order communication before computation); the value in effect. Call it before
    anything starts CUDA (the training scripts do, first thing)."""
    return os.environ.setdefault(VARIABLE, str(QUEUES))


def queues_hint() -> str | None:
    """One line for a ``dali-gpu`` user whose process left the variable unset, else None."""
    if os.environ.get(VARIABLE):
        return None
    return (f"{VARIABLE} is unset, so DALI's GPU streams share CUDA's 8 hardware queues with the model's and can "
            f"fall behind it; `export {VARIABLE}={QUEUES}` before the script starts CUDA (measured on an H100: "
            "ResNet-50 training 94 % -> 97 % of synthetic-data speed; crossdali's training scripts set it)")
