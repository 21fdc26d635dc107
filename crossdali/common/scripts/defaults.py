"""The defaults a training script picks from the machine, decided here once for every framework.

A flag whose default is "from the machine" parses to None (``--amp``, ``--channels-last``, ``-b``,
``-j`` of the classification scripts: ``crossdali.common.scripts.train_args``); each script calls
``resolve_defaults`` as soon as it knows whether a CUDA GPU trains, before any loader is built.
Where a CUDA GPU trains the defaults are the fast configuration (mixed precision, channels-last
memory, a batch that keeps the GPU busy, DALI threads for the CPUs this process may use); on the
CPU they are the float32 settings the CPU runs and tests use. Where ``crossdali tune`` measured this
dataset, backend, batch and crop size on this machine (``crossdali.common.tune``), its threads,
hardware-decoder share and pipelines replace the defaults of those flags. A flag given on the command line
always wins. The resolved values go back into ``args`` (so loaders and checkpoints see them), into
one log line, and into the run's start record::

    defaults = resolve_defaults(args, cuda=device.type == "cuda", world_size=dist.world_size)
    metrics.write(event="start", ..., lr=defaults.lr, **defaults.record())
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["GPU_BATCH_SIZE", "CPU_BATCH_SIZE", "CPU_WORKERS", "MAX_WORKERS", "LR_REFERENCE_BATCH", "AUTO_HELP",
           "ResolvedDefaults", "resolve_defaults", "default_workers", "local_process_count"]

log = logging.getLogger(__name__)

#: ``-b`` where a CUDA GPU trains and ``-b`` is not given: ResNet-50's batch per GPU in the benchmarks
#: (docs/benchmarks.md), which keeps the GPU busy. On the CPU: ``CPU_BATCH_SIZE``.
GPU_BATCH_SIZE = 256
CPU_BATCH_SIZE = 128
#: ``-j`` on the CPU, where DALI's threads share the cores with the model itself
CPU_WORKERS = 4
#: ``-j`` at most, where a CUDA GPU trains
MAX_WORKERS = 16
#: ``--lr`` is the learning rate for a global batch of this many samples, scaled linearly (Goyal et al., 2017)
LR_REFERENCE_BATCH = 256

#: what ``--help`` says of each default decided here
AUTO_HELP = {
    "amp": "; default: on where a CUDA GPU trains, off (float32) on the CPU",
    "channels_last": "; default: on where a CUDA GPU trains, off on the CPU",
    "batch_size": f"; default: {GPU_BATCH_SIZE} where a CUDA GPU trains (ResNet-50's batch per GPU in "
                  f"docs/benchmarks.md: lower it for a bigger model or a smaller GPU), {CPU_BATCH_SIZE} on the CPU",
    "workers": f"; default: where a CUDA GPU trains, the CPUs this process may use (os.sched_getaffinity) divided "
               f"among the processes on this node, less one for the training loop, 1 to {MAX_WORKERS}; "
               f"{CPU_WORKERS} on the CPU",
}

#: launchers' variables for the number of processes on this node
_LOCAL_SIZE_VARIABLES = ("LOCAL_WORLD_SIZE", "HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                         "MV2_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE")


def local_process_count(world_size: int = 1, env: Mapping[str, str] | None = None) -> int:
    """Processes of this job on this node: what the launcher says (torchrun, Horovod, Open MPI, MPICH,
    MVAPICH, Slurm), else ``world_size`` (as if every process ran here: never more threads than cores)."""
    env = os.environ if env is None else env
    for name in _LOCAL_SIZE_VARIABLES:
        value = env.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return max(1, world_size)


def default_workers(*, cuda: bool, local_processes: int = 1, cpus: int | None = None) -> int:
    """``-j`` when not given: ``CPU_WORKERS`` on the CPU; where a CUDA GPU trains, this process's share
    of the CPUs it may use (``cpus``; default ``os.sched_getaffinity``), less one for the training
    loop, between 1 and ``MAX_WORKERS``."""
    if not cuda:
        return CPU_WORKERS
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_WORKERS, cpus // max(1, local_processes) - 1))


@dataclass(frozen=True)
class ResolvedDefaults:
    """What a run trains with, after ``resolve_defaults``; ``auto`` names the settings the machine chose."""

    cuda: bool
    amp: bool
    memory_format: str  #: channels_last or contiguous (PyTorch), else the layout the framework's models use
    batch_size: int  #: per process
    workers: int
    lr: float  #: the peak learning rate: --lr x global batch / reference batch
    lr_rule: str  #: how ``lr`` was found, e.g. "0.1 x 256/256"
    auto: tuple[str, ...]
    tune_file: str | None = None  #: the ``crossdali tune`` file whose values the run uses, if any
    tuned: tuple[str, ...] = ()  #: the settings taken from it (workers, hw_decoder_load, pipelines)

    def record(self) -> dict[str, object]:
        """Fields of the start record (``batch_size`` and ``lr`` are already there)."""
        record = {"amp": self.amp, "memory_format": self.memory_format, "workers": self.workers,
                  "lr_rule": self.lr_rule, "auto_defaults": list(self.auto), "cuda": self.cuda}
        if self.tune_file is not None:
            record |= {"tune_file": self.tune_file, "tuned": list(self.tuned)}
        return record

    def line(self) -> str:
        """One line for the log: every setting, "(auto)" where the machine chose it."""
        def tag(name: str) -> str:
            return " (tuned)" if name in self.tuned else " (auto)" if name in self.auto else ""
        line = (f"{'CUDA GPU' if self.cuda else 'CPU'}: amp {'on' if self.amp else 'off'}{tag('amp')}, "
                f"memory format {self.memory_format}{tag('channels_last')}, batch {self.batch_size} per process"
                f"{tag('batch_size')}, lr {self.lr:g} = {self.lr_rule}, -j {self.workers}{tag('workers')}")
        if self.tune_file is not None:
            line += f"; {', '.join(self.tuned) or 'nothing (every tuned flag was given)'} from crossdali tune: {self.tune_file}"
        return line


#: the flags ``crossdali tune`` sets where they are not on the command line: args attribute -> spelling
_TUNED_FLAGS = {"hw_decoder_load": "--hw-decoder-load", "pipelines": "--pipelines"}


def _on_command_line(flag: str, argv: Sequence[str]) -> bool:
    """Whether ``flag`` (or an abbreviation argparse accepts, or ``flag=value``) is in ``argv``."""
    for token in argv:
        name = token.split("=", 1)[0]
        if name.startswith("--") and len(name) > 3 and flag.startswith(name):
            return True
    return False


def _tuned_settings(args: argparse.Namespace, cuda: bool):
    """``(file, TuneSettings, backend)`` of ``crossdali tune`` for this run's --data, backend, batch and crop on
    this machine, or None (no local --data, a backend without DALI pipelines, nothing tuned)."""
    data, crop = getattr(args, "data", None), getattr(args, "crop_size", None)
    if not isinstance(data, Path) or crop is None or getattr(args, "multi_label", False):
        return None
    from crossdali.common.options import DALI_BACKENDS
    from crossdali.common.scripts.tune_files import read_tune

    backend = getattr(args, "data_backend", "auto")
    backend = ("dali-gpu" if cuda else "dali-cpu") if backend == "auto" else backend
    if backend not in DALI_BACKENDS:
        return None
    found = read_tune(data, backend, args.batch_size, crop)
    return None if found is None else (*found, backend)


def resolve_defaults(args: argparse.Namespace, *, cuda: bool, world_size: int = 1, layout: str | None = None,
                     reference_batch: int = LR_REFERENCE_BATCH, local_processes: int | None = None,
                     cpus: int | None = None, argv: Sequence[str] | None = None) -> ResolvedDefaults:
    """Fill the flags left to the machine (None in ``args``) and say what the run trains with.

    Args:
        args: the parsed command line; ``amp``, ``channels_last``, ``batch_size`` and ``workers`` that are
            None are set here (explicit values stay), so every later reader of ``args`` sees the concrete value.
        cuda: whether the model trains on a CUDA GPU.
        world_size: processes in the job (the global batch is ``batch_size * world_size``).
        layout: the memory layout of the framework's models where ``--channels-last`` does not change it
            ("NHWC" for Keras and flax, "NCHW" for Gluon); None: the script follows ``--channels-last`` (PyTorch).
        reference_batch: the global batch ``--lr`` is for; the run's learning rate scales linearly from it.
        local_processes: processes on this node (default: ``local_process_count``).
        cpus: CPUs this process may use (default: ``os.sched_getaffinity``).
        argv: the command line the flags came from (default ``sys.argv[1:]``): a tuned flag on it keeps its value.

    Where ``crossdali tune`` wrote a file for ``args.data`` (a local folder), the backend (``auto``: dali-gpu
    where a CUDA GPU trains, else dali-cpu), ``args.batch_size`` and ``args.crop_size`` on this machine, its
    thread count fills ``workers`` when None (divided among this node's processes), and its hardware-decoder
    share (dali-gpu) and pipelines replace ``args.hw_decoder_load`` / ``args.pipelines`` unless ``argv`` gives them,
    and its prefetch depth becomes ``args.prefetch_queue_depth`` (the PyTorch script passes it to its loaders).
    """
    auto = []
    if getattr(args, "amp", None) is None:
        args.amp = cuda
        auto.append("amp")
    if layout is None:
        if args.channels_last is None:
            args.channels_last = cuda
            auto.append("channels_last")
        memory_format = "channels_last" if args.channels_last else "contiguous"
    else:
        memory_format = layout
    if args.batch_size is None:
        args.batch_size = GPU_BATCH_SIZE if cuda else CPU_BATCH_SIZE
        auto.append("batch_size")
    local = local_process_count(world_size) if local_processes is None else local_processes
    found, tuned = _tuned_settings(args, cuda), []
    if args.workers is None:
        if found is not None:  # measured for one process: the node's processes share the threads
            args.workers = max(1, found[1].workers // max(1, local))
            tuned.append("workers")
        else:
            args.workers = default_workers(cuda=cuda, local_processes=local, cpus=cpus)
        auto.append("workers")
    if found is not None:
        argv = sys.argv[1:] if argv is None else argv
        for name, flag in _TUNED_FLAGS.items():
            if not hasattr(args, name) or _on_command_line(flag, argv):
                continue
            if name == "hw_decoder_load" and found[2] != "dali-gpu":
                continue
            if name == "pipelines" and getattr(args, "global_order", False):  # one pipeline per rank there
                continue
            setattr(args, name, getattr(found[1], name))
            tuned.append(name)
        args.prefetch_queue_depth = found[1].prefetch  # no flag: the tuned depth, else the loaders' default
        tuned.append("prefetch_queue_depth")
    global_batch = args.batch_size * world_size
    resolved = ResolvedDefaults(cuda=cuda, amp=bool(args.amp), memory_format=memory_format, batch_size=args.batch_size,
                                workers=args.workers, lr=args.lr * global_batch / reference_batch,
                                lr_rule=f"{args.lr:g} x {global_batch}/{reference_batch}", auto=tuple(auto),
                                tune_file=None if found is None else str(found[0]), tuned=tuple(tuned))
    log.info("run settings on the %s", resolved.line())
    return resolved
