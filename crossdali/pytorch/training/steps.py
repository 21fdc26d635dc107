"""What happens around every training step, the same in every script: the loss read a step late,
the step's metrics record and progress, ``checkpoint_last`` every N steps, and the graceful stop on
SIGTERM/SIGINT that every rank agrees on."""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from crossdali.common.errors import UsageError
from crossdali.common.scripts.metrics import MetricsWriter
from crossdali.common.scripts.progress import EpochProgress
from crossdali.common.scripts.runs import epoch_line
from crossdali.common.scripts.script import TrainingStopped
from crossdali.pytorch.distributed import Runtime
from crossdali.pytorch.training.checkpoint import Checkpointer, TrainState

__all__ = ["StopRequest", "copy_to_host", "StepTracker"]

log = logging.getLogger(__name__)


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
        ``agreed`` at every step would leave the GPU idle while the host fetched and launched the next
        step, which costs several-GPU training a large share of its speed (docs/benchmarks.md#multi-gpu)."""
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
    event) and read one step late, once the next step is launched: the host waits for that step's kernels
    only, while the GPU runs the next step's (with a fused optimizer nothing else makes it wait;
    ``create_optimizer``), so the host may queue one step beyond the GPU's. Reading the loss tensor itself
    (``float(loss)``, ``loss.item()``) would copy it behind every kernel queued since, so the host would
    wait until the GPU had nothing left to do, and the GPU would idle while the host fetched and launched
    the next step (docs/benchmarks.md#training-speed). The records, sums and progress are the same, one
    step later; every checkpoint, stop and epoch end reads the pending steps first. Step times tile the
    epoch: from one ``step_done`` to the next (the last pending step's until its last kernel). On a GPU
    each step record also has ``gpu_wait_s``, how long the host then waited for that step's kernels: the
    host's lead over the GPU. Near 0 means the GPU had already finished the step when the host launched
    the next one, so the GPU waited for the host (the loader's ``next()`` or Python), not the other way
    round."""

    def __init__(self, state: TrainState, *, runtime: Runtime, checkpointer: Checkpointer, metrics: MetricsWriter,
                 stop: StopRequest, epochs: int, checkpoint_every: int = 0, print_freq: int = 10,
                 unit: str = "img") -> None:
        self.state, self.runtime, self.checkpointer, self.metrics, self.stop = state, runtime, checkpointer, metrics, stop
        self.epochs, self.checkpoint_every, self.print_freq, self.unit = epochs, checkpoint_every, print_freq, unit
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
        if len(self._pending) > 1:
            oldest = self._pending.popleft()
            if oldest.copied is not None:
                # The host's lead: ~0 when the GPU had already run that step, i.e. waited for the host
                # (the data loader or Python), not the other way round (gpu_wait_s)
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
