"""How a PyTorch training script starts: the process group, logging and the graceful stop
(``training_session``), the data backend, the seed, the run folder every rank agrees on."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import torch

from crossdali.common.distributed import ENGINES as FRAMEWORK_ENGINES
from crossdali.common.loading.cuda_queues import VARIABLE as CUDA_QUEUES_VARIABLE
from crossdali.common.loading.cuda_queues import share_gpu_with_dali
from crossdali.common.scripts.script import configure_logging
from crossdali.common.scripts.train_args import resolve_backend
from crossdali.pytorch.distributed import Runtime, gather_objects, init_distributed
from crossdali.pytorch.training.steps import StopRequest

__all__ = ["ENGINES", "training_session", "choose_backend", "seed_everything", "agree_run_dir", "build_on_rank0"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: ``--engine`` choices of every PyTorch script.
ENGINES = FRAMEWORK_ENGINES["pytorch"]


@contextmanager
def training_session(*, engine: str, debug: bool = False) -> Iterator[tuple[Runtime, StopRequest]]:
    """The process group (``--engine``), logging (INFO on rank 0), and SIGTERM/SIGINT turned into a
    graceful stop, undone at the end whatever happens. First of all, before CUDA starts: a hardware
    queue for each of DALI's streams (``crossdali.common.loading.cuda_queues``)."""
    queues = share_gpu_with_dali()
    runtime = init_distributed(engine=engine)
    configure_logging(is_main=runtime.dist.is_main, debug=debug)
    if runtime.device.type == "cuda":
        log.info("%s=%s (CUDA hardware queues: DALI's streams beside the model's)", CUDA_QUEUES_VARIABLE, queues)
    stop = StopRequest(announce=runtime.dist.is_main, several_ranks=runtime.dist.is_distributed).install()
    try:
        yield runtime, stop
    finally:
        stop.uninstall()
        runtime.shutdown()


def choose_backend(requested: str, *, gpu_note: str = "DALI mixed decoder",
                   cpu_note: str = "DALI runs all operators on the CPU") -> str:
    """``--data-backend auto`` -> dali-gpu with a visible CUDA GPU, else dali-cpu (said in one line)."""
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return resolve_backend(requested, gpu=gpu, gpu_note=gpu_note, cpu_note=cpu_note)


def seed_everything(seed: int) -> None:
    """The same initial weights on every run and every rank, and the same results on the CPU.

    The data order and augmentation are DALI's, fixed by the same seed whatever its thread count.
    On the CPU the results depend on torch's intra-op thread count (convolution and BatchNorm
    gradients are summed in per-thread parts), so it is logged: runs with the same count on the
    same kind of CPU are bit-identical (docs/classification.md). On the GPU cuDNN's autotuner
    (``benchmark``) stays off: it picks convolution algorithms by timing them, so two runs could
    pick different ones and round differently.
    """
    torch.manual_seed(seed)
    torch.backends.cudnn.benchmark = False
    log.info("seed %d; torch uses %d CPU threads (OMP_NUM_THREADS; the same count gives the same results)",
             seed, torch.get_num_threads())


def agree_run_dir(runtime: Runtime, run_dir: Path) -> Path:
    """Rank 0's run folder on every rank (a default name holds the start time, which ranks may see
    differently); only rank 0 writes there, but every rank names it when it stops."""
    return Path(gather_objects(runtime, str(run_dir))[0])


def build_on_rank0(runtime: Runtime, build: Callable[[], T]) -> T:
    """``build()`` on rank 0 first (e.g. the sample set), then on the first rank of each other node (where a
    node does not share rank 0's disk it builds its own copy, one process per node, never two into one
    folder), then on the other ranks (by then a no-op that finds what was built)."""
    if runtime.dist.is_main:
        build()
    runtime.barrier()
    if runtime.dist.local_rank == 0 and not runtime.dist.is_main:
        build()
    runtime.barrier()
    return build()
