"""The pieces every PyTorch training script shares (classification, SSD, video), so a fix lands
once: backend choice, seeding, optimiser and warm-up + cosine schedule, mixed precision with a
``GradScaler``, accuracy, the per-step bookkeeping (data wait, metrics record, progress bar,
checkpoints every N steps, a graceful stop on SIGTERM/SIGINT) and checkpoints that resume
mid-epoch with exactly the batches, augmentation and losses of an uninterrupted run.

The scripts keep torchvision's shape (``get_args_parser``, ``train_one_epoch``, ``evaluate``,
``load_data``, ``main``); each ``train_one_epoch`` is::

    for images, target in tracker.steps(loader):
        with amp.autocast():
            loss = criterion(model(images), target)
        amp.backward_step(loss, optimizer)
        scheduler.step()
        tracker.step_done(loss, images.shape[0])
    return tracker.epoch_stats()

Checkpoints hold tensors and plain values only and are loaded with ``torch.load(weights_only=True)``:
a checkpoint from elsewhere cannot run code.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import re
import shutil
import signal
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from crossdali.common.distributed import ENGINES as FRAMEWORK_ENGINES
from crossdali.common.errors import UsageError
from crossdali.common.loading.cuda_queues import VARIABLE as CUDA_QUEUES_VARIABLE
from crossdali.common.loading.cuda_queues import share_gpu_with_dali
from crossdali.common.scripts.metrics import MetricsWriter, topk_for
from crossdali.common.scripts.progress import EpochProgress
from crossdali.common.scripts.runs import choose_run_dir, epoch_line, finish_run, open_metrics, plain_config
from crossdali.common.scripts.script import TrainingStopped, configure_logging
from crossdali.common.scripts.train_args import resolve_backend
from crossdali.pytorch.distributed import Runtime, init_distributed
from crossdali.pytorch.loaders import SyntheticBatches  # the scripts' synthetic loader, in __all__ here too

__all__ = ["ENGINES", "CHECKPOINT_LAST", "CHECKPOINT_BEST", "training_session", "choose_backend", "seed_everything",
           "agree_run_dir", "build_on_rank0", "scaled_lr", "create_optimizer", "create_scheduler", "MixedPrecision",
           "accuracy_counts", "topk_correct", "evaluate_classifier", "SyntheticBatches", "gather_objects", "StopRequest",
           "model_stream", "TrainState", "Checkpointer", "copy_to_host", "load_checkpoint", "StepTracker", "Run",
           "start_run"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: ``--engine`` choices of every PyTorch script.
ENGINES = FRAMEWORK_ENGINES["pytorch"]
CHECKPOINT_LAST = "checkpoint_last.pth"
CHECKPOINT_BEST = "checkpoint_best.pth"
_FORMAT = "crossdali.pytorch.training/1"


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


@contextmanager
def model_stream(runtime: Runtime, choice: str = "default") -> Iterator[None]:
    """``--model-stream high``: everything the script queues (model, optimizer, DALI's copies out) on a
    CUDA stream of the highest priority, so that when DALI's decoding kernels (on its own streams, of
    the default priority) and the model's wait for the same SMs, the block scheduler runs the model's
    first and DALI's fill its gaps. DALI's iterator copies each batch on the current stream, so the
    order between a batch and its step is kept. ``default``: torch's default stream."""
    if choice == "default":
        yield
        return
    if runtime.device.type != "cuda":
        raise UsageError(f"--model-stream {choice}: the model runs on the {runtime.device.type} here, and stream "
                         "priorities are CUDA's; leave --model-stream out")
    device = runtime.device
    # torch.cuda.Stream maps a priority beyond its range to the nearest valid one (its docstring): the highest
    stream = torch.cuda.Stream(device, priority=-100)
    stream.wait_stream(torch.cuda.current_stream(device))
    try:
        with torch.cuda.stream(stream):
            yield
    finally:
        torch.cuda.current_stream(device).wait_stream(stream)


def resolve_cuda_graphs(runtime: Runtime, choice: str = "auto") -> bool:
    """``--cuda-graphs auto|on|off``: whether ``graph_model`` captures the model. ``auto``: where one
    process trains on a CUDA GPU (ResNet-50 AMP on an H100 fed by ``dali-gpu``: 96.2 % of synthetic
    speed eager, 97.6 % graphed; README, 2026-11-28). ``on`` where that cannot be is refused in one line,
    before any data is read or any run folder made."""
    if choice == "off":
        return False
    why = None
    if runtime.device.type != "cuda":
        why = f"the model runs on the {runtime.device.type} here, and CUDA graphs are CUDA's"
    elif runtime.engine != "none":
        why = (f"one process only (this job runs {runtime.dist.world_size} under {runtime.engine}, whose gradient "
               "hooks a graph cannot hold)")
    if why is not None and choice == "on":
        raise UsageError(f"--cuda-graphs on: {why}; leave --cuda-graphs out")
    return why is None


def graph_model(model: torch.nn.Module, *, batch_shape: tuple[int, ...], runtime: Runtime, amp: MixedPrecision,
                channels_last: bool = False) -> torch.nn.Module:
    """``--cuda-graphs``: the model's training forward and backward captured as two CUDA graphs
    (``torch.cuda.make_graphed_callables``), so that a step costs the host two graph launches, the loss
    and the fused optimizer's few kernels instead of the hundreds of kernels of ResNet-50, and a host
    stall (the loader, Python) shorter than the host's lead no longer leaves the GPU idle. In place;
    returns ``model``.

    Batches of ``batch_shape`` replay the graphs (copied into the graph's static input first); any other
    shape (an epoch's short last batch) and eval mode run the ordinary forward. The graphs keep their
    own memory for a full batch's activations, so that short batch needs its own beside them. The
    capture's warm-up runs the model on a random batch: the BatchNorm statistics it moves are put back,
    so a graphed run trains from the same state as an eager one. Call it before the first step; the
    parameters must not be replaced afterwards (a checkpoint loads into them in place). A model that
    cannot be captured (it reads a value back to the host, or changes shape) is a UsageError naming
    ``--cuda-graphs off``: a failed capture leaves CUDA's random generator unusable in this process
    (seen on an H100: the next ``torch.randn`` fails), so the run cannot go on without graphs instead.
    """
    t0 = time.perf_counter()
    eager_forward = model.forward
    buffers = [b.detach().clone() for b in model.buffers()]
    sample = torch.randn(batch_shape, device=runtime.device)
    if channels_last:
        sample = sample.contiguous(memory_format=torch.channels_last)
    was_training = model.training
    model.train()
    try:
        with amp.autocast(cache=False), warnings.catch_warnings():
            # make_graphed_callables's own doing, printed at every capture (seen on an H100, torch 2.11): its warm-up
            # backward starts on autograd's thread, and the parameters' gradient nodes get its capture stream.
            # The README's graphed rows were measured with both printed; filtering them changes no kernel.
            warnings.filterwarnings("ignore", message="Attempting to run cuBLAS, but there was no current CUDA context")
            warnings.filterwarnings("ignore", message="The AccumulateGrad node's stream does not match")
            torch.cuda.make_graphed_callables(model, (sample,))
    except Exception as e:
        why = (str(e).strip().splitlines() or [""])[0]
        raise UsageError(f"--cuda-graphs: {type(model).__name__} cannot be captured as a CUDA graph "
                         f"({type(e).__name__}: {why}); rerun with --cuda-graphs off") from e
    model.train(was_training)
    with torch.no_grad():
        for saved, b in zip(buffers, model.buffers()):
            b.copy_(saved)
    graphed_forward = model.forward  # make_graphed_callables's: the graphs in the mode they were captured in

    def forward(images: torch.Tensor) -> torch.Tensor:
        return graphed_forward(images) if images.shape == sample.shape else eager_forward(images)

    model.forward = forward
    log.info("CUDA graphs: the training forward and backward captured for batches of %s in %.1f s",
             "x".join(map(str, batch_shape)), time.perf_counter() - t0)
    return model


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
    """``build()`` on rank 0 first (e.g. the sample set), the other ranks after it finished."""
    if runtime.dist.is_main:
        build()
    runtime.barrier()
    return build()


def scaled_lr(lr: float, *, batch_size: int, world_size: int, reference_batch: int | None) -> float:
    """``lr`` given for a global batch of ``reference_batch``, scaled linearly to this job's global batch."""
    return lr if reference_batch is None else lr * batch_size * world_size / reference_batch


def create_optimizer(name: str, params: Iterable, *, lr: float, momentum: float = 0.9,
                     weight_decay: float = 0.0, fused: bool | None = None) -> torch.optim.Optimizer:
    """``sgd`` (with momentum) or ``adamw`` by name (``--opt``); PyTorch's fused implementation when
    the parameters are on a CUDA GPU: with it, ``GradScaler`` hands the inf/NaN check to the optimizer's
    kernel instead of reading it on the host every step, so the host is not held back by the GPU
    (measured on an H100, ResNet-50 AMP, batch 256: synthetic data 4,688-4,699 -> 4,898-4,899 images/s,
    dali-gpu 4,406-4,446 -> 4,748-4,755, results/classification/train_fix_queues_32_2026-11-26.json,
    loops "scaler" and "fused"). ``fused``: force it on or off (default: on for CUDA parameters)."""
    params = list(params)
    if fused is None:
        fused = bool(params) and all(isinstance(p, torch.Tensor) and p.is_cuda for p in params)
    if name == "sgd":
        optimizer = torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, fused=fused or None)
        if fused and momentum:
            # PyTorch 2.11's fused SGD creates its momentum buffers uninitialised on its first step and
            # fills them in the kernel, which GradScaler skips while the gradients overflow (the first
            # steps of every AMP run): the garbage stays and the weights turn NaN (measured on an H100,
            # ResNet-50, step 5). Zeros first are the same arithmetic: buffer = momentum * 0 + gradient.
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


def topk_correct(output: torch.Tensor, target: torch.Tensor, topk: tuple[int, ...] = (1, 5)) -> torch.Tensor:
    """Number of samples whose target is among the top-k predictions, for each k, on ``output``'s device."""
    maxk = min(max(topk), output.shape[1])
    pred = output.topk(maxk, dim=1).indices
    correct = pred.eq(target.view(-1, 1))
    return torch.stack([correct[:, : min(k, maxk)].any(dim=1).sum() for k in topk])


def accuracy_counts(output: torch.Tensor, target: torch.Tensor, topk: tuple[int, ...] = (1, 5)) -> list[int]:
    """Number of samples whose target is among the top-k predictions, for each k."""
    return topk_correct(output, target, topk).tolist()


def val_outputs(model: torch.nn.Module, loader: Iterable, *, runtime: Runtime, amp: MixedPrecision,
                channels_last: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(float32 model output, target)`` of every val batch on the device (call in inference mode)."""
    model.eval()
    for inputs, target in loader:
        inputs, target = inputs.to(runtime.device, non_blocking=True), target.to(runtime.device, non_blocking=True)
        if channels_last:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        with amp.autocast():
            output = model(inputs)
        yield output.float(), target


@torch.inference_mode()
def evaluate_classifier(model: torch.nn.Module, criterion: torch.nn.Module, loader: Iterable, *, runtime: Runtime,
                        amp: MixedPrecision, num_classes: int, channels_last: bool = False) -> dict[str, float]:
    """Loss and top-k (k < classes) over every val sample, each seen once across all ranks."""
    ks = topk_for(num_classes)
    # the loss sum and the top-k counts stay on the device until the last batch: a read per batch would
    # make the host wait for each batch's model before fetching the next one (StepTracker's docstring)
    totals = torch.zeros(1 + len(ks), dtype=torch.float64, device=runtime.device)
    seen = 0
    start = time.perf_counter()
    for output, target in val_outputs(model, loader, runtime=runtime, amp=amp, channels_last=channels_last):
        totals[0] += criterion(output, target).double() * output.shape[0]
        totals[1:] += topk_correct(output, target, ks)
        seen += output.shape[0]
    loss_sum, *correct = totals.tolist()
    loss_sum, seen, *correct = runtime.all_reduce_sum([loss_sum, seen, *correct])
    stats = {"val_loss": loss_sum / max(seen, 1), "val_samples": int(seen), "eval_seconds": time.perf_counter() - start}
    return stats | {f"val_top{k}": 100 * c / max(seen, 1) for k, c in zip(ks, correct)}


@torch.inference_mode()
def evaluate_multilabel(model: torch.nn.Module, criterion: torch.nn.Module, loader: Iterable, *, runtime: Runtime,
                        amp: MixedPrecision, channels_last: bool = False) -> dict[str, float]:
    """Binary cross-entropy, mAP and macro F1 (sigmoid >= 0.5) over every val sample, each seen
    once across all ranks: the scores are gathered, since average precision ranks them all."""
    from crossdali.common.multilabel import multilabel_metrics

    # scores, targets and the loss sum stay on the device until the last batch (as in evaluate_classifier)
    loss_total = torch.zeros((), dtype=torch.float64, device=runtime.device)
    scores, targets = [], []
    start = time.perf_counter()
    for output, target in val_outputs(model, loader, runtime=runtime, amp=amp, channels_last=channels_last):
        loss_total += criterion(output, target).double() * output.shape[0]
        scores.append(torch.sigmoid(output))
        targets.append(target)
    mine = (torch.cat(scores).cpu().numpy(), torch.cat(targets).cpu().numpy()) if scores else None
    parts = [p for p in gather_objects(runtime, mine) if p is not None]
    (loss_sum,) = runtime.all_reduce_sum([loss_total.item()])
    seen = sum(len(p[0]) for p in parts)  # the gathered parts are every rank's already
    stats = {"val_loss": loss_sum / max(seen, 1), "val_samples": int(seen), "eval_seconds": time.perf_counter() - start}
    if not parts:
        return stats
    import numpy as np

    found = multilabel_metrics(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    return stats | {"val_map": found["map"], "val_f1": found["f1"]}


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


class StopRequest:
    """SIGTERM/SIGINT ask for a graceful stop: the current step finishes, a checkpoint is saved,
    the script exits. A second Ctrl-C stops at once. Every rank must stop after the same step
    (data-parallel collectives), so the ranks agree on whether any of them was signalled: every step
    with ``agreed_late`` (the question asked at one step is answered at the next, so a signalled job
    of several processes finishes the step after the signal's too) and at the epoch's end with
    ``agreed``.
    """

    def __init__(self, *, announce: bool = True, several_ranks: bool = False) -> None:
        self.signum = 0
        self._announce = announce
        self._previous: dict[int, Any] = {}
        self._asked: Callable[[], list[float]] | None = None  # the question agreed_late asked last
        self._several_ranks = several_ranks  # for the announcement: such ranks agree a step late

    def install(self) -> StopRequest:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        if not self.signum:
            self.signum = signum
            if self._announce:  # os.write: safe inside a signal handler, unlike logging
                steps = "this step and the next (every rank stops after the same one)" if self._several_ranks else "this step"
                os.write(2, f"\n{signal.Signals(signum).name} received: finishing {steps}, saving a checkpoint, "
                            "then stopping (Ctrl-C again stops at once, without saving)\n".encode())

    def agreed(self, runtime: Runtime) -> int:
        """The signal to stop for (0: go on), the same on every rank; waits for every rank's answer
        (so for the GPU to finish its queued work: call it where the loop waits anyway)."""
        if not runtime.dist.is_distributed:
            return self.signum
        earlier = self._answer()
        asked, = runtime.all_reduce_sum([1.0 if self.signum else 0.0])
        return self._verdict(earlier + asked)

    def agreed_late(self, runtime: Runtime) -> int:
        """The same, for every step of a training loop: answers the question asked at the previous call
        (whose sum the GPU has long finished) and asks this step's, so the host never waits for the GPU.
        ``agreed`` at every step left the GPU idle while the host fetched and launched the next step:
        ResNet-50 AMP under DDP on two H100s trained at 0.740-0.857 of the one-GPU per-GPU rate with it,
        0.945-0.963 with this (docs/distributed.md, Several GPUs)."""
        if not runtime.dist.is_distributed:
            return self.signum
        verdict = self._verdict(self._answer())
        if not verdict:  # every rank takes the same branch: the collectives stay matched
            self._asked = runtime.start_all_reduce_sum([1.0 if self.signum else 0.0], name="crossdali.stop")
        return verdict

    def _answer(self) -> float:
        asked, self._asked = self._asked, None
        return asked()[0] if asked is not None else 0.0

    def _verdict(self, asked: float) -> int:
        return (self.signum or int(signal.SIGTERM)) if asked > 0 else 0


@dataclass
class TrainState:
    """Everything a resumed run needs to continue as if it had never stopped: the objects whose
    ``state_dict`` is saved, where training stands (``epoch`` in progress, optimizer ``step`` in it,
    ``global_step`` overall) and the running sums of the epoch in progress."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    amp: MixedPrecision
    loader: Any  # the train loader (crossdali.common.loading.loaders.Loader)
    epoch: int = 0
    step: int = 0
    global_step: int = 0
    best: float | None = None
    best_epoch: int | None = None
    sums: dict[str, float] = field(default_factory=lambda: {"loss": 0.0, "samples": 0.0, "data_wait": 0.0})
    seconds: float = 0.0  # training time of the epoch in progress (this rank)

    def next_epoch(self) -> None:
        self.epoch, self.step = self.epoch + 1, 0
        self.sums = {k: 0.0 for k in self.sums}
        self.seconds = 0.0


def _atomic_save(obj: Any, path: Path) -> None:
    """``torch.save`` to a temporary file in the same folder, then rename: a reader (or a resume after
    a crash mid-write) sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def load_checkpoint(path: Path, *, flag: str = "--resume") -> dict:
    """A crossdali checkpoint, loaded with ``weights_only=True`` (tensors and plain values only:
    a file with pickled objects is refused, since unpickling it could run code)."""
    if not path.is_file():
        raise UsageError(f"{flag} {path} does not exist" + (f" (a folder: pass {path / CHECKPOINT_LAST})"
                                                           if path.is_dir() else ""))
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a file that is not a checkpoint at all
        found = re.search(r"GLOBAL ([\w.]+)", str(e)) if isinstance(e, pickle.UnpicklingError) else None
        if found:
            raise UsageError(f"{flag} {path} holds pickled Python objects (it refers to {found.group(1)}), which "
                             "could run code when loaded, so it is refused: crossdali loads checkpoints with "
                             "torch.load(weights_only=True); save only state dicts of tensors and plain values") from None
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else ""
        raise UsageError(f"{flag} {path} is not a readable PyTorch checkpoint ({type(e).__name__}"
                         f"{': ' + reason[:200] if reason else ''})") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt:
        raise UsageError(f"{flag} {path} is a PyTorch file but not a training checkpoint (no 'model' state dict)")
    return ckpt


class Checkpointer:
    """``checkpoint_last.pth`` (each epoch end, every ``--checkpoint-every`` steps, on a stop) and
    ``checkpoint_best.pth`` (best ``metric`` so far) in ``run_dir``, written atomically by rank 0.

    Besides the state dicts a checkpoint holds ``meta`` (task, arch, class names, the full config
    as plain values) and, per rank, the loader state (DALI's reader position and random state)
    and the RNG state: every rank resumes its own shard where it stopped.
    """

    def __init__(self, run_dir: Path, *, runtime: Runtime, meta: dict, metric: str | None,
                 higher_is_better: bool = True) -> None:
        self.run_dir, self.runtime, self.meta = Path(run_dir), runtime, meta
        self.metric, self.higher_is_better = metric, higher_is_better
        self.last, self.best = self.run_dir / CHECKPOINT_LAST, self.run_dir / CHECKPOINT_BEST

    def save(self, state: TrainState, *, best: bool = False) -> Path:
        """Save ``state`` (call on every rank: it gathers the ranks' loader states)."""
        per_rank = gather_objects(self.runtime, {"loader": state.loader.state_dict(), "rng": _rng_state()})
        loss, samples, wait = self.runtime.all_reduce_sum([state.sums["loss"], state.sums["samples"],
                                                           state.sums["data_wait"]])
        if self.runtime.dist.is_main:
            payload = {
                "format": _FORMAT, **self.meta,
                "model": state.model.state_dict(), "optimizer": state.optimizer.state_dict(),
                "scheduler": state.scheduler.state_dict(), "scaler": state.amp.scaler.state_dict(),
                "epoch": state.epoch, "step": state.step, "global_step": state.global_step,
                "best": state.best, "best_epoch": state.best_epoch, "world_size": self.runtime.dist.world_size,
                "sums": {"loss": loss, "samples": samples, "data_wait": wait}, "seconds": state.seconds,
                "ranks": per_rank,
            }
            self.run_dir.mkdir(parents=True, exist_ok=True)
            _atomic_save(payload, self.last)
            if best:  # the same bytes: copy rather than serialise the state twice
                tmp = self.best.with_name(f".{self.best.name}.tmp-{os.getpid()}")
                shutil.copyfile(self.last, tmp)
                os.replace(tmp, self.best)
            log.debug("saved %s (epoch %d, step %d)", self.last, state.epoch + 1, state.step)
        self.runtime.barrier()  # no rank exits (e.g. on a stop) while rank 0 is still writing
        return self.last

    def improved(self, state: TrainState, stats: dict) -> bool:
        """Record ``stats[metric]`` in ``state.best`` if it beats the best so far."""
        value = stats.get(self.metric) if self.metric else None
        if value is None or not math.isfinite(value):
            return False
        better = state.best is None or (value > state.best if self.higher_is_better else value < state.best)
        if better:
            state.best, state.best_epoch = value, state.epoch + 1
        return better

    def restore(self, ckpt: dict, state: TrainState, *, path: Path) -> None:
        """Continue from ``ckpt``: weights, optimizer, schedule, loss scale, RNG, this rank's loader
        position, the epoch and step in it, and the epoch's running sums."""
        if ckpt.get("format") != _FORMAT:
            raise UsageError(f"--resume {path} was not written by this version of crossdali's PyTorch scripts "
                             f"(format {ckpt.get('format')!r}, expected {_FORMAT!r}); use it with --test-only, or "
                             "start a new run")
        self._check_model(ckpt, path)
        world = self.runtime.dist.world_size
        if ckpt["world_size"] != world:
            raise UsageError(f"--resume {path} was saved by {ckpt['world_size']} process(es) and this job has {world}: "
                             "training resumes with the same number (each rank continues its own data shard, and "
                             "the global batch sets the schedule); --test-only evaluates it with any number")
        state.model.load_state_dict(ckpt["model"])
        state.optimizer.load_state_dict(ckpt["optimizer"])
        state.scheduler.load_state_dict(ckpt["scheduler"])
        state.amp.scaler.load_state_dict(ckpt["scaler"])
        state.epoch, state.step, state.global_step = ckpt["epoch"], ckpt["step"], ckpt["global_step"]
        state.best, state.best_epoch = ckpt["best"], ckpt["best_epoch"]
        mine = ckpt["ranks"][self.runtime.dist.rank]
        state.loader.load_state_dict(mine["loader"])
        _set_rng_state(mine["rng"])
        if self.runtime.dist.is_main:  # the epoch's sums over all ranks so far: rank 0 carries them on
            state.sums, state.seconds = dict(ckpt["sums"]), ckpt["seconds"]
        planned = ckpt.get("config", {}).get("epochs")
        if planned is not None and planned != self.meta["config"].get("epochs"):
            log.warning("--resume %s was planned for %s epochs, now %s: the learning rate continues on the new "
                        "warm-up + cosine schedule", path, planned, self.meta["config"].get("epochs"))
        log.info("resumed from %s at epoch %d, step %d", path, state.epoch + 1, state.step)

    def resume(self, ckpt: dict | None, state: TrainState, *, path: Path | None, test_only: bool) -> None:
        """``--resume``: the whole training state, or only the weights with ``--test-only``."""
        if ckpt is None:
            return
        if test_only:
            self.load_weights(ckpt, state.model, path=path)
        else:
            self.restore(ckpt, state, path=path)

    def load_weights(self, ckpt: dict, model: torch.nn.Module, *, path: Path) -> None:
        """Only the weights (``--test-only``): any number of processes, any checkpoint format of ours."""
        self._check_model(ckpt, path)
        model.load_state_dict(ckpt["model"])
        log.info("weights from %s%s", path, f" (epoch {ckpt['epoch']}, step {ckpt['step']})" if "epoch" in ckpt else "")

    def _check_model(self, ckpt: dict, path: Path) -> None:
        for key in ("arch", "num_classes"):
            if key in ckpt and key in self.meta and ckpt[key] != self.meta[key]:
                raise UsageError(f"--resume {path} holds a model with {key}={ckpt[key]!r}, but this run builds "
                                 f"{key}={self.meta[key]!r}: pass the same --arch and data")


def copy_to_host(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """A host copy of ``tensor`` and, for a CUDA tensor, the event after which it holds the value: the
    copy (into pinned memory, non-blocking) is queued now, behind the kernels queued so far and not
    behind later ones, so ``event.synchronize()`` later waits for those kernels only (``StepTracker``)."""
    tensor = tensor.detach()
    if not tensor.is_cuda:
        return tensor, None
    host = torch.empty_like(tensor, device="cpu", pin_memory=True).copy_(tensor, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record()
    return host, copied


@dataclass
class _Step:
    """A finished step whose loss the host has not read yet (``StepTracker``)."""

    loss: torch.Tensor  #: on the host: on a GPU run, a pinned copy that lands when ``copied`` has happened
    copied: torch.cuda.Event | None
    samples: int
    epoch: int
    step: int
    lr: float
    wait: float
    seconds: float
    gpu_wait: float | None = None  #: the host's wait for this step's kernels once the next step was launched


class StepTracker:
    """What happens around every training step, the same in every script: data wait and step
    time, the ``step`` metrics record, the progress bar or line, ``checkpoint_last`` every
    ``checkpoint_every`` steps, and the graceful stop (``StopRequest``) after a step.

    A step's loss is copied to the host as its last queued work (a pinned, non-blocking copy and a CUDA
    event) and read ``steps_ahead`` steps late (1: once the next step is launched): the host waits for that
    step's kernels only, while the GPU runs the ones after it (with a fused optimizer nothing else makes it
    wait; ``create_optimizer``), so the host may queue up to ``steps_ahead`` steps beyond the GPU's.
    Reading the loss tensor itself (``float(loss)``, ``loss.item()``) would copy it
    behind every kernel queued since, so the host would wait until the GPU had nothing left to do: that
    cost ResNet-50 fed by ``dali-gpu`` on an H100 3-4 points of synthetic speed (README, classification
    section). The records, sums and progress are the same, ``steps_ahead`` steps later; every checkpoint,
    stop and epoch end reads the pending steps first. Step times tile the epoch: from one ``step_done`` to the next
    (the last pending step's until its last kernel). On a GPU each step record also has ``gpu_wait_s``, how
    long the host then waited for that step's kernels: the host's lead over the GPU. Near 0 means the GPU had
    already finished the step when the host launched the one ``steps_ahead`` later, so the GPU waited for the host (the
    loader's ``next()`` or Python), not the other way round."""

    def __init__(self, state: TrainState, *, runtime: Runtime, checkpointer: Checkpointer, metrics: MetricsWriter,
                 stop: StopRequest, epochs: int, checkpoint_every: int = 0, print_freq: int = 10,
                 unit: str = "img", steps_ahead: int = 1) -> None:
        if steps_ahead < 1:
            raise ValueError(f"steps_ahead must be at least 1, got {steps_ahead}")
        self.state, self.runtime, self.checkpointer, self.metrics, self.stop = state, runtime, checkpointer, metrics, stop
        self.epochs, self.checkpoint_every, self.print_freq, self.unit = epochs, checkpoint_every, print_freq, unit
        self.steps_ahead = steps_ahead
        self._progress: EpochProgress | None = None
        self._pending: deque[_Step] = deque()  #: launched, loss not read yet, oldest first
        self._t0 = self._fetch_t0 = self._wait = self._lr = 0.0

    def steps(self, loader: Iterable) -> Iterator:
        """The batches of the epoch in progress (the rest of it, when resumed mid-epoch)."""
        state = self.state
        self._progress = EpochProgress(total=len(loader), initial=state.step, desc=f"epoch {state.epoch + 1}/{self.epochs}",
                                       enabled=self.runtime.dist.is_main, print_freq=self.print_freq, unit=self.unit)
        self._t0 = self._fetch_t0 = time.perf_counter()
        try:
            for batch in loader:
                self._wait = time.perf_counter() - self._fetch_t0
                self._lr = state.optimizer.param_groups[0]["lr"]  # the rate this step uses
                yield batch
            self._flush()  # the epoch's last step (not when a stop or an error ends the loop early)
        finally:
            self._progress.close()

    def step_done(self, loss: torch.Tensor, samples: int) -> None:
        """After the optimizer (and scheduler) step: the previous step's book-keeping (its loss is read
        now, while the GPU runs this one), then a checkpoint or a stop if due."""
        state = self.state
        now = time.perf_counter()
        state.step += 1
        state.global_step += 1
        loss, copied = copy_to_host(loss)  # behind this step's kernels, not behind the next step's
        done = _Step(loss=loss, copied=copied, samples=samples, epoch=state.epoch + 1, step=state.step, lr=self._lr,
                     wait=self._wait, seconds=now - self._t0)
        self._t0 = now
        self._pending.append(done)
        if len(self._pending) > self.steps_ahead:
            oldest = self._pending.popleft()
            if oldest.copied is not None:
                # The host's lead: ~0 when the GPU had already run that step, i.e. waited for the host
                # (the data loader or Python), not the other way round (gpu_wait_s, README)
                t = time.perf_counter()
                oldest.copied.synchronize()  # that step's kernels and its loss's copy, not the ones queued since
                oldest.gpu_wait = time.perf_counter() - t
            self._record(oldest)
        if self.checkpoint_every and state.global_step % self.checkpoint_every == 0:
            self._flush()
            self.checkpointer.save(state)
            self._t0 = time.perf_counter()  # saving is not training time
        self.stop_if_asked(late=True)
        self._fetch_t0 = time.perf_counter()

    def _record(self, step: _Step) -> None:
        """A finished step (its ``copied`` event waited for by the caller): its loss read on the host,
        added to the epoch's sums, the metrics and the progress."""
        state = self.state
        value = float(step.loss)
        state.sums["loss"] += value * step.samples
        state.sums["samples"] += step.samples
        state.sums["data_wait"] += step.wait
        state.seconds += step.seconds
        world = self.runtime.dist.world_size
        self.metrics.write(event="step", epoch=step.epoch, step=step.step, loss=value, lr=step.lr,
                           samples=step.samples * world, step_s=step.seconds, data_wait_s=step.wait,
                           **({"gpu_wait_s": step.gpu_wait} if step.gpu_wait is not None else {}))
        self._progress.update(loss=value, lr=step.lr, samples=step.samples * world, step_seconds=step.seconds,
                              data_wait_seconds=step.wait)

    def _flush(self) -> None:
        """Read the pending steps now (before a checkpoint, a stop or the epoch's end): the last one's
        time runs until its last kernel has finished."""
        if not self._pending:
            return
        while self._pending:
            step = self._pending.popleft()
            if step.copied is not None:
                # The loss copy is the step's last queued work, so its event ends the step. Not
                # torch.cuda.synchronize(): that also waits for the loader's GPU work on its own streams
                # (DALI decoding the next epoch's first batches), which is not this step's time.
                step.copied.synchronize()
            if not self._pending:
                step.seconds += time.perf_counter() - self._t0
            self._record(step)
        self._t0 = time.perf_counter()

    def stop_if_asked(self, *, late: bool = False) -> None:
        """Save and raise ``TrainingStopped`` if any rank was signalled (call on every rank); ``late``:
        by the answer to the previous step's question (``StopRequest.agreed_late``)."""
        signum = self.stop.agreed_late(self.runtime) if late else self.stop.agreed(self.runtime)
        if not signum:
            return
        self._flush()
        if self._progress is not None:
            self._progress.close()
        state = self.state
        path = self.checkpointer.save(state)
        where = f"epoch {state.epoch + 1}, step {state.step}" if state.step else f"the start of epoch {state.epoch + 1}"
        raise TrainingStopped(f"stopped by {signal.Signals(signum).name} at {where}; checkpoint {path}; continue with "
                              f"the same command and --resume {path}", signum=signum)

    def epoch_stats(self) -> dict[str, float]:
        """The epoch's training numbers over all ranks (resumed epochs include the part before the stop)."""
        state = self.state
        loss, samples, wait = self.runtime.all_reduce_sum([state.sums["loss"], state.sums["samples"],
                                                           state.sums["data_wait"]])
        return {"train_loss": loss / max(samples, 1), "train_samples": int(samples), "train_seconds": state.seconds,
                "train_img_s": samples / max(state.seconds, 1e-9), "data_wait_s": wait / self.runtime.dist.world_size}

    def end_epoch(self, stats: dict[str, float]) -> None:
        """After training and evaluating an epoch: the epoch record, the log line with the run's ETA,
        ``checkpoint_last`` (and ``checkpoint_best`` if the metric improved), then stop if asked."""
        state = self.state
        if not math.isfinite(stats["train_loss"]):  # diverged: the flags' doing, not a bug (one line, exit 2)
            lr = state.optimizer.param_groups[0].get("initial_lr", state.optimizer.param_groups[0]["lr"])
            raise UsageError(f"training loss is {stats['train_loss']} at epoch {state.epoch + 1} (peak learning rate "
                             f"{lr:.4g}): lower --lr or lengthen --lr-warmup-epochs")
        best = self.checkpointer.improved(state, stats)
        epoch = state.epoch
        self.metrics.write(event="epoch", epoch=epoch + 1, lr=state.optimizer.param_groups[0]["lr"], **stats)
        log.info(epoch_line(epoch, self.epochs, stats, unit=self.unit) + ("  (best)" if best else ""))
        state.next_epoch()
        self.checkpointer.save(state, best=best)
        self._progress = None
        self.stop_if_asked()


@dataclass
class Run:
    """What a PyTorch training script trains with once its model is built, set up the same way by
    the classification, SSD and video scripts (``start_run``)."""

    args: Any
    runtime: Runtime
    model: torch.nn.Module  #: the bare model: what checkpoints hold
    ddp_model: torch.nn.Module  #: what the steps run (DDP-wrapped under torchrun)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    amp: MixedPrecision
    run_dir: Path
    checkpointer: Checkpointer
    state: TrainState
    metrics: MetricsWriter
    metric: str
    lr: float

    def tracker(self, stop: StopRequest, *, unit: str = "img") -> StepTracker:
        """The per-step bookkeeping of this run's epochs (``--checkpoint-every``, ``--print-freq``)."""
        return StepTracker(self.state, runtime=self.runtime, checkpointer=self.checkpointer, metrics=self.metrics,
                           stop=stop, epochs=self.args.epochs, checkpoint_every=self.args.checkpoint_every,
                           print_freq=self.args.print_freq, unit=unit,
                           steps_ahead=getattr(self.args, "steps_ahead", 1))

    def finish(self, *, unit: str = "img") -> None:
        """The summary record, the plot and the summary lines (rank 0), then the metrics file closed."""
        if self.runtime.dist.is_main:
            finish_run(self.run_dir, metrics=self.metrics, metric=self.metric, unit=unit)
        self.metrics.close()


def start_run(args: Any, runtime: Runtime, model: torch.nn.Module, train_loader: Any, *, task: str, metric: str,
              ckpt: dict | None, backend: str, num_classes: int, class_names: list[str],
              reference_batch: int | None, warmup_start_factor: float = 0.1, meta: dict | None = None,
              start: dict | None = None) -> Run:
    """Optimizer and schedule (``--opt``, ``--lr`` scaled to the global batch from
    ``reference_batch``, warm-up from ``warmup_start_factor``), AMP, the run folder and its
    checkpointer (``metric`` picks ``checkpoint_best``), the model wrapped for the engine, the
    ``--resume`` state restored, and ``metrics.jsonl`` opened with its ``start`` record. ``meta``:
    more of the checkpoint's metadata; ``start``: more fields of the start record."""
    lr = scaled_lr(args.lr, batch_size=args.batch_size, world_size=runtime.dist.world_size,
                   reference_batch=reference_batch)
    optimizer = create_optimizer(args.opt, model.parameters(), lr=lr, momentum=args.momentum,
                                 weight_decay=args.weight_decay)
    scheduler = create_scheduler(optimizer, epochs=args.epochs, steps_per_epoch=len(train_loader),
                                 warmup_epochs=args.lr_warmup_epochs, start_factor=warmup_start_factor)
    amp = MixedPrecision(enabled=args.amp, runtime=runtime)
    run_dir = choose_run_dir(args.output_dir, resume=args.resume, task=task, framework="pytorch", arch=args.arch)
    run_dir = agree_run_dir(runtime, run_dir)
    checkpointer = Checkpointer(run_dir, runtime=runtime, metric=metric, meta={
        "task": task, "framework": "pytorch", "arch": args.arch, "num_classes": num_classes, **(meta or {}),
        "class_names": class_names, "config": plain_config(args)})
    ddp_model = runtime.wrap_model(model)
    optimizer = runtime.wrap_optimizer(optimizer, model)
    state = TrainState(model=model, optimizer=optimizer, scheduler=scheduler, amp=amp, loader=train_loader)
    checkpointer.resume(ckpt, state, path=args.resume, test_only=args.test_only)
    metrics = open_metrics(run_dir, continuing=ckpt is not None, enabled=runtime.dist.is_main)
    log.info("outputs: %s", run_dir)
    metrics.write(event="start", task=task, framework="pytorch", arch=args.arch, backend=backend,
                  world_size=runtime.dist.world_size, engine=runtime.engine, batch_size=args.batch_size, lr=lr,
                  epochs=args.epochs, num_classes=num_classes, resumed_from=str(args.resume) if ckpt else None,
                  epoch=state.epoch, step=state.step, torch_threads=torch.get_num_threads(),
                  cuda_queues=os.environ.get(CUDA_QUEUES_VARIABLE) if runtime.device.type == "cuda" else None,
                  fused_optimizer=bool(optimizer.param_groups[0].get("fused")), **(start or {}))
    return Run(args=args, runtime=runtime, model=model, ddp_model=ddp_model, optimizer=optimizer, scheduler=scheduler,
               amp=amp, run_dir=run_dir, checkpointer=checkpointer, state=state, metrics=metrics, metric=metric, lr=lr)
