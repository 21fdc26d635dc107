"""Data-parallel set-up for PyTorch under any launcher: DDP (torchrun, Slurm, mpirun with a
rendezvous address) or Horovod (horovodrun) when it is importable.

Rank and world size always come from ``crossdali.common.distributed``, so sharding follows the
global rank whatever the launcher.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from crossdali.common.distributed import DistInfo, detect_distributed

__all__ = ["Runtime", "init_distributed", "gather_objects"]

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    """This process's place in the job and the engine that averages gradients."""

    dist: DistInfo
    device: torch.device
    engine: str  # "none" | "ddp" | "horovod"

    @property
    def gpu_id(self) -> int | None:
        """The GPU of this rank (its DALI pipelines' ``device_id``); ``None`` on the CPU."""
        return self.device.index if self.device.type == "cuda" else None

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.engine == "ddp":
            ids = [self.device.index] if self.device.type == "cuda" else None
            return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
        if self.engine == "horovod":
            _broadcast_buffers_on_eval(model)
        return model

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> torch.optim.Optimizer:
        if self.engine != "horovod":
            return optimizer
        import horovod.torch as hvd

        # Horovod 0.28 broadcasts and allreduces only contiguous tensors; --channels-last makes conv
        # weights, their gradients and momentum buffers non-contiguous ("Tensor is required to be
        # contiguous"): broadcast contiguous copies, and allreduce gradients through a copy.
        state = model.state_dict()
        copies = {name: t.contiguous() for name, t in state.items()}
        hvd.broadcast_parameters(copies, root_rank=0)
        for name, t in state.items():
            if copies[name] is not t:
                t.copy_(copies[name])
        for param_state in optimizer.state.values():
            for key, value in param_state.items():
                if torch.is_tensor(value) and not value.is_contiguous():
                    param_state[key] = value.contiguous()
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        distributed = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                               compression=_ContiguousGradients)
        hvd_zero_grad = distributed.zero_grad

        def zero_grad(set_to_none: bool = True) -> None:
            # Horovod 0.28's zero_grad() takes no argument (and sets gradients to None); accept
            # torch's signature so train loops need not know which engine runs them
            hvd_zero_grad()

        distributed.zero_grad = zero_grad
        return distributed

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        """Sum ``values`` over all ranks (metrics: counts, correct predictions, loss sums)."""
        t = torch.tensor(values, dtype=torch.float64)
        if self.engine == "ddp":
            t = t.to(self.device) if torch.distributed.get_backend() == "nccl" else t
            torch.distributed.all_reduce(t)
        elif self.engine == "horovod":
            import horovod.torch as hvd

            t = hvd.allreduce(t, op=hvd.Sum, name="metrics")
        return t.cpu().tolist()

    def start_all_reduce_sum(self, values: list[float], *, name: str) -> Callable[[], list[float]]:
        """Start summing ``values`` over all ranks and return at once; calling the result gives the
        sums. ``all_reduce_sum`` waits until the GPU has run every kernel queued so far (its copies to
        and from the GPU synchronise the stream), so a training loop that calls it every step lets the
        GPU go idle every step. Here, under NCCL, the sum is queued behind this step's kernels and
        copied back into pinned memory with an event: the result waits for those kernels only, and read
        one step later, it costs no GPU time. ``name``: Horovod's name for the operation (one in flight)."""
        t = torch.tensor(values, dtype=torch.float64)
        if self.engine == "ddp" and torch.distributed.get_backend() == "nccl":
            t = t.pin_memory().to(self.device, non_blocking=True)
            torch.distributed.all_reduce(t)  # NCCL: the stream waits, not the host
            host = torch.empty_like(t, device="cpu", pin_memory=True).copy_(t, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(torch.cuda.current_stream(self.device))

            def result() -> list[float]:
                copied.synchronize()
                return host.tolist()
            return result
        if self.engine == "ddp":  # Gloo, on the CPU
            work = torch.distributed.all_reduce(t, async_op=True)
            return lambda: (work.wait(), t.tolist())[1]
        if self.engine == "horovod":
            import horovod.torch as hvd

            handle = hvd.allreduce_async(t, op=hvd.Sum, name=name)
            return lambda: hvd.synchronize(handle).tolist()
        return t.tolist

    def barrier(self) -> None:
        if self.engine == "ddp":  # NCCL: name the rank's GPU (else torch warns that it guesses it)
            nccl = torch.distributed.get_backend() == "nccl"
            torch.distributed.barrier(device_ids=[self.device.index] if nccl else None)
        elif self.engine == "horovod":
            import horovod.torch as hvd

            hvd.join()

    def shutdown(self) -> None:
        if self.engine == "ddp" and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


class _ContiguousGradients:
    """A Horovod "compression" that only makes gradients contiguous (channels-last ones are not)."""

    @staticmethod
    def compress(tensor: torch.Tensor):
        return tensor.contiguous(), None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx) -> torch.Tensor:
        return tensor


def _broadcast_buffers_on_eval(model: torch.nn.Module) -> None:
    """Give every rank rank 0's buffers (BatchNorm running statistics) when ``model`` switches to
    eval mode.

    Horovod averages gradients but not buffers, so each rank's running statistics drift apart on
    its own shard: the ranks would evaluate different models, and the top-1 a job reports would not
    be that of the checkpoint rank 0 saves. DDP broadcasts rank 0's buffers before each forward;
    this does the same once per ``model.eval()``, which every rank calls at the same point.
    """
    import horovod.torch as hvd

    train = model.train

    def train_or_eval(mode: bool = True) -> torch.nn.Module:
        if not mode and model.training:
            buffers = {name: b for name, b in model.named_buffers() if b is not None}
            hvd.broadcast_parameters(buffers, root_rank=0)
        return train(mode)

    model.train = train_or_eval


def _horovod_available() -> bool:
    try:
        import horovod.torch  # noqa: F401
    except ImportError:
        return False
    return True


def init_distributed(*, engine: str = "auto") -> Runtime:
    """Start the process group the launcher asked for.

    ``engine="auto"``: Horovod under horovodrun (HOROVOD_RANK set) or under plain mpirun when
    Horovod is importable; DDP for torchrun and Slurm; a single process otherwise.
    """
    dist = detect_distributed()
    if engine == "auto":
        if dist.launcher == "horovodrun" or (dist.launcher in ("openmpi", "mpich") and _horovod_available()):
            engine = "horovod"
        elif dist.is_distributed:
            engine = "ddp"
        else:
            engine = "none"
    if engine == "horovod":
        try:
            import horovod.torch as hvd
        except ImportError:
            raise ImportError("this job was started by horovodrun but horovod.torch cannot be imported: "
                              "install it with scripts/install-horovod, or launch with torchrun") from None
        hvd.init()
        dist = DistInfo(rank=hvd.rank(), world_size=hvd.size(), local_rank=hvd.local_rank(), launcher=dist.launcher)
    elif engine == "ddp":
        if "MASTER_ADDR" not in os.environ:
            raise RuntimeError(f"{dist.world_size} processes started by {dist.launcher} but MASTER_ADDR/MASTER_PORT "
                               "are not set: launch with torchrun, or export them for every rank")
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        os.environ.setdefault("RANK", str(dist.rank))
        os.environ.setdefault("WORLD_SIZE", str(dist.world_size))
        torch.distributed.init_process_group(backend=backend, rank=dist.rank, world_size=dist.world_size)
    elif engine != "none":
        raise ValueError(f"engine must be 'auto', 'ddp', 'horovod' or 'none', got {engine!r}")
    if torch.cuda.is_available():  # the local rank's GPU, or the one GPU a launcher bound this process to
        gpu = dist.gpu_id(visible_gpus=torch.cuda.device_count())
        torch.cuda.set_device(gpu)
        device = torch.device("cuda", gpu)
    else:
        device = torch.device("cpu")
    return Runtime(dist=dist, device=device, engine=engine)


def gather_objects(runtime: Runtime, obj: Any) -> list:
    """Every rank's ``obj`` (picklable), in rank order, on every rank."""
    if runtime.engine == "ddp":
        parts = [None] * runtime.dist.world_size
        torch.distributed.all_gather_object(parts, obj)
        return parts
    if runtime.engine == "horovod":
        import horovod.torch as hvd

        # evaluate() runs in inference mode; Horovod's background thread writes into the tensors
        # it creates, which inference mode forbids ("Inplace update to inference tensor")
        with torch.inference_mode(False):
            return list(hvd.allgather_object(obj))
    return [obj]
