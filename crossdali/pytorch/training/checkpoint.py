"""Checkpoints that resume mid-epoch with exactly the batches, augmentation and losses of an
uninterrupted run: what a run's state is (``TrainState``), how it is saved and restored
(``Checkpointer``), and how a checkpoint file is read (``load_checkpoint``).

Checkpoints hold tensors and plain values only and are loaded with ``torch.load(weights_only=True)``:
a checkpoint from elsewhere cannot run code.
"""

from __future__ import annotations

import logging
import math
import pickle
import re
import shutil
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from crossdali.common.errors import UsageError
from crossdali.common.files import write_atomically
from crossdali.pytorch.distributed import Runtime, gather_objects
from crossdali.pytorch.training.amp import MixedPrecision

__all__ = ["CHECKPOINT_LAST", "CHECKPOINT_BEST", "TrainState", "Checkpointer", "load_checkpoint"]

log = logging.getLogger(__name__)

CHECKPOINT_LAST = "checkpoint_last.pth"

CHECKPOINT_BEST = "checkpoint_best.pth"

_FORMAT = "crossdali.pytorch.training/1"


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
    a crash mid-write) sees the old file or the new one, never half of one; a failed write is a
    ``WriteError`` naming the file and the cause (``crossdali.common.files``)."""
    write_atomically(path, lambda f: torch.save(obj, f), what="checkpoint")


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
        with open(path, "rb") as f:
            if f.read(4) == b"PK\x03\x04" and not zipfile.is_zipfile(path):  # a zip cut short: no directory
                raise UsageError(f"{flag} {path} is truncated: a PyTorch checkpoint whose end is missing (a copy or "
                                 "a write that stopped early); resume from another checkpoint of the run, e.g. "
                                 f"{CHECKPOINT_BEST}") from None
        reason = str(e).strip().split(". ")[0].splitlines()[0] if str(e).strip() else ""
        raise UsageError(f"{flag} {path} is not a readable PyTorch checkpoint ({type(e).__name__}"
                         f"{': ' + reason[:160] if reason else ''})") from None
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
                with open(self.last, "rb") as src:
                    write_atomically(self.best, lambda f: shutil.copyfileobj(src, f), what="checkpoint")
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
        resize = ckpt["world_size"] != world
        if resize and getattr(state.loader, "order", None) is None:
            raise UsageError(f"--resume {path} was saved by {ckpt['world_size']} process(es) and this job has {world}: "
                             "training resumes with the same number (each rank continues its own data shard), unless "
                             "both runs train with --global-order; --test-only evaluates it with any number")
        base_lrs = list(state.scheduler.base_lrs)  # this job's learning rate (scaled for its global batch)
        state.model.load_state_dict(ckpt["model"])
        state.optimizer.load_state_dict(ckpt["optimizer"])
        state.scheduler.load_state_dict(ckpt["scheduler"])
        state.amp.scaler.load_state_dict(ckpt["scaler"])
        state.epoch, state.step, state.global_step = ckpt["epoch"], ckpt["step"], ckpt["global_step"]
        state.best, state.best_epoch = ckpt["best"], ckpt["best_epoch"]
        mine = ckpt["ranks"][min(self.runtime.dist.rank, len(ckpt["ranks"]) - 1)]
        if resize:
            self._resize(ckpt, state, base_lrs)
        else:
            state.loader.load_state_dict(mine["loader"])
        _set_rng_state(mine["rng"])
        if self.runtime.dist.is_main:  # the epoch's sums over all ranks so far: rank 0 carries them on
            state.sums, state.seconds = dict(ckpt["sums"]), ckpt["seconds"]
        planned = ckpt.get("config", {}).get("epochs")
        if planned is not None and planned != self.meta["config"].get("epochs"):
            log.warning("--resume %s was planned for %s epochs, now %s: the learning rate continues on the new "
                        "warm-up + cosine schedule", path, planned, self.meta["config"].get("epochs"))
        log.info("resumed from %s at epoch %d, step %d", path, state.epoch + 1, state.step)

    def _resize(self, ckpt: dict, state: TrainState, base_lrs: list[float]) -> None:
        """Continue a checkpoint of another number of processes (global order): the loader reads the samples
        the saved job had not read this epoch, split over this job's ranks; the step counter and the
        learning-rate schedule continue at the same point of the epoch in this job's steps (its global batch
        differs, and ``--lr`` is scaled for it)."""
        loader = state.loader
        step = loader.resume_from_ranks([r["loader"] for r in ckpt["ranks"]])
        if loader.epoch != state.epoch:  # saved after the epoch's last step, before its end
            log.warning("--resume: epoch %d had been read to its end; continuing with epoch %d", state.epoch + 1,
                        loader.epoch + 1)
            state.epoch = loader.epoch
            state.sums, state.seconds, step = {k: 0.0 for k in state.sums}, 0.0, 0
        state.step, state.global_step = step, state.epoch * len(loader) + step
        scheduler = state.scheduler
        scheduler.base_lrs, scheduler.last_epoch = base_lrs, state.global_step
        lrs = [base * f(state.global_step) for base, f in zip(base_lrs, scheduler.lr_lambdas, strict=True)]
        for group, base, lr in zip(state.optimizer.param_groups, base_lrs, lrs, strict=True):
            group["initial_lr"], group["lr"] = base, lr
        scheduler._last_lr = lrs
        log.warning("--resume: saved by %d process(es), continued by %d: the global batch is now %d (was %d); "
                    "epoch %d continues at step %d of %d", ckpt["world_size"], self.runtime.dist.world_size,
                    loader.batch_size * self.runtime.dist.world_size, loader.batch_size * ckpt["world_size"],
                    state.epoch + 1, step, len(loader))

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
