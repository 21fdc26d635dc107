"""Rank, local rank and world size from whichever launcher started this process.

Data sharding must use the GLOBAL rank: sharding by local rank (as DALI's RN50 example does) makes
every node read the same shards when a job spans more than one node.

Launchers and the variables they set (first match wins, in this order):

=====================  ======================  ========================  =====================
launcher               rank                    world size                local rank
=====================  ======================  ========================  =====================
torchrun               RANK                    WORLD_SIZE                LOCAL_RANK
horovodrun (gloo)      HOROVOD_RANK            HOROVOD_SIZE              HOROVOD_LOCAL_RANK
Open MPI (mpirun,      OMPI_COMM_WORLD_RANK    OMPI_COMM_WORLD_SIZE      OMPI_COMM_WORLD_LOCAL_RANK
horovodrun over MPI)
MPICH / Intel MPI      PMI_RANK                PMI_SIZE                  MPI_LOCALRANKID
Slurm (srun)           SLURM_PROCID            SLURM_NTASKS              SLURM_LOCALID
=====================  ======================  ========================  =====================

A rank's GPU is its local rank when the process sees every GPU of its node (torchrun, horovodrun,
``srun --gpus-per-node``), and GPU 0 when the launcher left it only its own (``srun --gpus-per-task=1``,
``--gpu-bind``, a ``CUDA_VISIBLE_DEVICES`` per process): ``local_gpu``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from crossdali.common.errors import UsageError

__all__ = ["ENGINES", "LAUNCHER_VARIABLES", "DistInfo", "cuda_visible_count", "detect_distributed",
           "gather_rows_by_sum", "gpu_reason", "local_gpu"]

#: launcher name -> (rank, world size, local rank) variable names, in detection order.
LAUNCHER_VARIABLES: dict[str, tuple[str, str, str]] = {
    "torchrun": ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
    "horovodrun": ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK"),
    "openmpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    "mpich": ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    "slurm": ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
}

#: ``--engine`` choices of each framework's scripts: how gradients are averaged across processes
ENGINES = {
    "pytorch": ("auto", "ddp", "horovod", "none"),
    "tensorflow": ("auto", "horovod", "tf-distribute", "none"),
    "mxnet": ("auto", "horovod", "kvstore", "none"),
    "jax": ("auto", "none"),  # one engine: jit over a mesh of every device, jax.distributed under a launcher
}


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job. ``launcher`` is ``"none"`` for a plain ``python`` run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    launcher: str = "none"

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def gpu_id(self, device_id: int | None = None, *, visible_gpus: int | None = None) -> int:
        """The GPU of this process on its node: ``device_id`` when given, else ``local_gpu`` of the local rank
        (one process per GPU on every node). Never the global rank: rank 2 of a job of two nodes with two GPUs
        each runs on GPU 0 of the second node, and that node has no GPU 2.

        ``visible_gpus``: how many GPUs this process sees, as its framework counts them; default
        ``cuda_visible_count()``, and the local rank when that cannot tell (no ``CUDA_VISIBLE_DEVICES``)."""
        if device_id is not None:
            return device_id
        if visible_gpus is None:
            visible_gpus = cuda_visible_count()
        return self.local_rank if visible_gpus is None else local_gpu(self.local_rank, visible_gpus)


def cuda_visible_count(env: Mapping[str, str] | None = None) -> int | None:
    """How many GPUs ``CUDA_VISIBLE_DEVICES`` leaves this process (a comma list of indices or UUIDs; empty:
    none), without asking a framework; ``None`` when it is not set (the process sees all of its node's)."""
    env = os.environ if env is None else env
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return len([part for part in value.split(",") if part.strip()])


def local_gpu(local_rank: int, visible_gpus: int) -> int:
    """The GPU index (as this process numbers them) that the process of ``local_rank`` should use, given how
    many GPUs it sees (``torch.cuda.device_count()``, TF's physical GPUs, JAX's local GPUs, mxnet's
    ``num_gpus()``, or ``cuda_visible_count()``).

    One GPU visible: 0, whatever the local rank: the launcher bound the process to its GPU (Slurm's
    ``--gpus-per-task=1`` or ``--gpu-bind``, a ``CUDA_VISIBLE_DEVICES`` per process), and asking for GPU
    ``local_rank`` would fail deep in a pipeline build with "invalid device ordinal". Several visible: the
    local rank (every process sees its node's GPUs). None visible: the local rank (a CPU run; nothing to
    choose). Several but not enough for the local rank: a ``UsageError``, since any choice would put two
    ranks on one GPU or pick one that is not there.
    """
    if visible_gpus == 1:
        return 0
    if visible_gpus == 0 or local_rank < visible_gpus:
        return local_rank
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    raise UsageError(
        f"local rank {local_rank} needs GPU {local_rank} but this process sees {visible_gpus} GPUs "
        f"(CUDA_VISIBLE_DEVICES={'unset' if visible is None else repr(visible)}): give each process all the GPUs "
        "of its node (srun --gpus-per-node, no CUDA_VISIBLE_DEVICES per process) or one GPU each "
        "(srun --gpus-per-task=1, or CUDA_VISIBLE_DEVICES=<one id> per process)")


def gpu_reason(local_rank: int, gpu: int, visible_gpus: int | None = None) -> str:
    """Why a rank runs on ``gpu``, for the log: the one GPU the launcher left it, its local rank, or a
    ``device_id`` given. ``visible_gpus`` defaults to ``cuda_visible_count()``."""
    visible = cuda_visible_count() if visible_gpus is None else visible_gpus
    if visible == 1 and gpu == 0:
        return "the one GPU this process sees (bound by the launcher)"
    if gpu == local_rank:
        return "the local rank's"
    return "device_id given"


def _int(env: Mapping[str, str], name: str, launcher: str) -> int:
    value = env[name]
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} (set by {launcher}) is not an integer") from None


def detect_distributed(env: Mapping[str, str] | None = None) -> DistInfo:
    """Read rank / world size / local rank from the environment of any supported launcher.

    ``env`` defaults to ``os.environ``. Raises ``ValueError`` for inconsistent values (for
    example a rank outside ``[0, world_size)``) so a misconfigured job fails before training.
    """
    env = os.environ if env is None else env
    for launcher, (rank_var, size_var, local_var) in LAUNCHER_VARIABLES.items():
        if rank_var not in env:
            continue
        if size_var not in env:
            # A non-zero rank with no world size would silently train as a single process on the
            # whole dataset; rank 0 alone (e.g. an sbatch script without srun) is a plain run.
            if env[rank_var].strip() not in ("", "0"):
                raise ValueError(f"{launcher}: {rank_var}={env[rank_var]} is set but {size_var} is not; "
                                 f"export {size_var} (the number of processes) or unset {rank_var}")
            continue
        rank = _int(env, rank_var, launcher)
        world_size = _int(env, size_var, launcher)
        # A launcher that does not say the local rank (e.g. MPICH without Hydra) runs one
        # process per node as far as we can tell: local rank 0.
        local_rank = _int(env, local_var, launcher) if local_var in env else 0
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(
                f"{launcher}: {rank_var}={rank} is not in [0, {size_var}={world_size}); "
                "check the launcher's command line"
            )
        if local_rank < 0:
            raise ValueError(f"{launcher}: {local_var}={local_rank} must not be negative")
        if local_rank >= world_size:
            raise ValueError(f"{launcher}: {local_var}={local_rank} is not in [0, {size_var}={world_size}); "
                             "check the launcher's command line")
        return DistInfo(rank=rank, world_size=world_size, local_rank=local_rank, launcher=launcher)
    return DistInfo()


def gather_rows_by_sum(rows, *, rank: int, world: int, sum_values, sum_array):
    """Every rank's ``rows`` (n_rank, ...) stacked in rank order, on every rank, written with the one
    collective every engine here has, a sum (``sum_values``: a list of floats; ``sum_array``: a
    float64 numpy array of the same shape on every rank). What multi-label mAP needs: average
    precision ranks the scores of the whole val set.

    Each rank places its rows in its own slot of a zero block of ``world x max(n_rank)`` rows and
    the blocks are summed (float64: scores and 0/1 targets come back exact). Costs ``world`` times
    the largest part in memory.
    """
    import numpy as np

    if world == 1:
        return rows
    counts = [0.0] * world
    counts[rank] = float(len(rows))
    counts = [int(c) for c in sum_values(counts)]
    block = np.zeros((world, max(counts), *rows.shape[1:]), dtype=np.float64)
    block[rank, :len(rows)] = rows
    summed = np.asarray(sum_array(block), dtype=np.float64).reshape(block.shape)
    return np.concatenate([summed[r, :counts[r]] for r in range(world)]).astype(rows.dtype)

