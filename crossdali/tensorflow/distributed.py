"""Data-parallel set-up for TensorFlow under any launcher: Horovod (horovodrun, mpirun, Slurm),
tf.distribute's ``MultiWorkerMirroredStrategy`` (``TF_CONFIG``), or one process.

Rank and world size come from ``crossdali.common.distributed`` (or Horovod / ``TF_CONFIG``), so
sharding follows the global rank whatever the launcher. Each process sees only its local GPU,
with memory growth on, before TensorFlow initialises it (DALI's decoders need GPU memory too).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os

import tensorflow as tf

from crossdali.common.distributed import ENGINES as FRAMEWORK_ENGINES
from crossdali.common.distributed import DistInfo, detect_distributed, gather_rows_by_sum
from crossdali.tensorflow.devices import enable_memory_growth

__all__ = ["ENGINES", "Runtime", "dist_from_tf_config", "init_distributed"]

log = logging.getLogger(__name__)

ENGINES = FRAMEWORK_ENGINES["tensorflow"]


class Runtime:
    """Rank, world size and gradient averaging: Horovod, tf.distribute (TF_CONFIG) or one process."""

    def __init__(self, dist: DistInfo, engine: str) -> None:
        self.dist, self.engine, self.hvd, self.strategy = dist, engine, None, None
        self.gpu_id: int | None = None  # the GPU of this rank (its DALI pipelines' device_id), set by setup
        if engine == "horovod":
            try:
                import horovod.tensorflow as hvd  # defer: optional, built separately
            except ImportError as e:
                raise ImportError("--engine horovod needs horovod built with TensorFlow: HOROVOD_WITH_TENSORFLOW=1 "
                                  f"pip install --no-build-isolation horovod==0.28.1 ({e})") from None
            hvd.init()
            self.hvd = hvd
            self.dist = DistInfo(rank=hvd.rank(), world_size=hvd.size(), local_rank=hvd.local_rank(),
                                 launcher=dist.launcher)
        elif engine == "tf-distribute":
            # one replica per worker process; TF_CONFIG names the workers and this one's index
            self.strategy = tf.distribute.MultiWorkerMirroredStrategy()
            self.dist = dist_from_tf_config(os.environ.get("TF_CONFIG", ""), local_rank=dist.local_rank)
            strategy = self.strategy

            @tf.function  # collectives run eagerly are slow (TF warns on every call)
            def strategy_sum(values):
                per_replica = strategy.run(tf.identity, args=(values,))
                return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

            self._strategy_sum = strategy_sum

    def scope(self):
        return self.strategy.scope() if self.strategy is not None else contextlib.nullcontext()

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        if self.hvd is not None:
            out = self.hvd.allreduce(tf.constant(values, tf.float64), op=self.hvd.Sum)
        elif self.strategy is not None:
            out = self._strategy_sum(tf.constant(values, tf.float64))
        else:
            return values
        return [float(v) for v in out.numpy()]

    def gather_rows(self, rows):
        """Every worker's ``rows`` stacked in rank order, on every worker (``gather_rows_by_sum``)."""
        return gather_rows_by_sum(rows, rank=self.dist.rank, world=self.dist.world_size,
                                  sum_values=self.all_reduce_sum,
                                  sum_array=lambda block: self.all_reduce_sum(block.reshape(-1).tolist()))


def dist_from_tf_config(tf_config: str, *, local_rank: int = 0) -> DistInfo:
    """Rank and world size of a ``tf.distribute`` worker from its ``TF_CONFIG``."""
    try:
        cfg = json.loads(tf_config)
        workers, task = cfg["cluster"]["worker"], cfg["task"]
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"--engine tf-distribute needs TF_CONFIG like '{{\"cluster\": {{\"worker\": [\"host1:port\", "
                         f"\"host2:port\"]}}, \"task\": {{\"type\": \"worker\", \"index\": 0}}}}', got {tf_config!r}") from None
    if task.get("type") != "worker" or set(cfg["cluster"]) != {"worker"}:
        raise ValueError(f"TF_CONFIG must list only 'worker' tasks (no chief/ps) for this script, got {tf_config!r}")
    return DistInfo(rank=int(task["index"]), world_size=len(workers), local_rank=local_rank, launcher="tf_config")


def init_distributed(*, engine: str = "auto") -> Runtime:
    """This process's ``Runtime``; call it before any TensorFlow op runs (it configures the GPU)."""
    dist = detect_distributed()
    if engine == "auto":
        if os.environ.get("TF_CONFIG") and not dist.is_distributed:
            engine = "tf-distribute"
        elif dist.is_distributed:
            if dist.launcher == "torchrun":
                raise RuntimeError("TensorFlow training under torchrun: torchrun starts the processes but TF has no "
                                   "process group for them; launch with horovodrun (or mpirun/srun with Horovod), "
                                   "or set TF_CONFIG per worker and pass --engine tf-distribute")
            engine = "horovod"
        else:
            engine = "none"
    if engine == "none" and dist.is_distributed:
        raise RuntimeError(f"{dist.launcher} started {dist.world_size} processes but --engine none averages no "
                           "gradients; use --engine horovod (pip install horovod with TensorFlow)")
    gpus = tf.config.list_physical_devices("GPU")
    gpu = None
    if gpus:  # one GPU per process: TF sees only its own (it becomes /GPU:0), DALI counts CUDA devices
        gpu = dist.gpu_id(visible_gpus=len(gpus))  # the local rank's, or the one a launcher bound this process to
        tf.config.set_visible_devices(gpus[gpu], "GPU")
        enable_memory_growth(strict=True)
    runtime = Runtime(dist, engine)
    runtime.gpu_id = gpu
    return runtime
