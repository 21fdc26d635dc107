"""What a training run leaves on disk, the same for every framework: its folder, its summary, the
plot of its curves (from ``metrics.jsonl``) and its best checkpoint.

Every run writes somewhere: ``--output-dir``, else the folder of the ``--resume`` checkpoint, else
``runs/<task>-<framework>-<arch>-<YYYYmmdd-HHMMSS>``; the script says where at start and at the end.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from crossdali.common.errors import UsageError
from crossdali.common.files import write_atomically, write_text_atomically
from crossdali.common.scripts.metrics import MetricsWriter, format_epoch_line, latest_records, read_metrics
from crossdali.common.scripts.progress import EpochProgress, format_duration

__all__ = ["PLOT_NAME", "BEST_CHECKPOINT", "CHECKPOINT_FORMAT", "default_run_dir", "choose_run_dir", "open_metrics",
           "plain_config", "label_names", "improved", "checkpoint_meta", "write_json", "BestCheckpoint", "StepLog",
           "ReadBehind", "epoch_line", "summarize", "format_summary", "plot_run", "finish_run"]

log = logging.getLogger(__name__)

PLOT_NAME = "curves.png"
#: The stem of a run's best checkpoint: PyTorch's ``checkpoint_best.pth``; TensorFlow's
#: ``checkpoint_best.index`` + ``.data-*``, JAX's ``.msgpack``, MXNet's ``.params`` + ``.states``,
#: each with ``checkpoint_best.json`` (``checkpoint_meta``) beside it.
BEST_CHECKPOINT = "checkpoint_best"
#: ``format`` of the JSON written by ``checkpoint_meta`` (TensorFlow, MXNet and JAX checkpoints).
CHECKPOINT_FORMAT = "crossdali.checkpoint/1"


def default_run_dir(*, task: str, framework: str, arch: str, root: Path | str = "runs",
                    now: float | None = None) -> Path:
    """``runs/<task>-<framework>-<arch>-<time>``; ``-2``, ``-3`` ... if two runs start in one second."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    base = Path(root) / f"{task}-{framework}-{arch}-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def choose_run_dir(output_dir: Path | None, *, resume: Path | None, task: str, framework: str, arch: str) -> Path:
    """Where this run writes (see the module docstring). Not created here: a run that fails before
    training leaves no empty folder behind."""
    if output_dir is not None:
        return Path(output_dir)
    if resume is not None:  # a checkpoint file, or the folder that holds it (TensorFlow, MXNet, JAX)
        return Path(resume) if Path(resume).is_dir() else Path(resume).parent
    return default_run_dir(task=task, framework=framework, arch=arch)


def open_metrics(run_dir: Path, *, continuing: bool, enabled: bool = True) -> MetricsWriter:
    """The run's ``metrics.jsonl`` writer (rank 0: ``enabled``). A resumed run (``continuing``)
    appends; a new run in a folder that holds an earlier run's file moves that file aside to
    ``metrics.<time>.jsonl`` rather than mixing two runs in one summary and plot."""
    path = Path(run_dir) / "metrics.jsonl"
    if enabled and not continuing and path.is_file():
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(path.stat().st_mtime))
        older = path.with_name(f"metrics.{stamp}.jsonl")
        path.rename(older)
        log.warning("%s held an earlier run's metrics: moved to %s", path, older.name)
    return MetricsWriter(run_dir, enabled=enabled)


def plain_config(args: argparse.Namespace | dict) -> dict:
    """The flags as plain values (paths as strings), safe to store in a checkpoint that is loaded
    without unpickling objects."""
    items = vars(args).items() if isinstance(args, argparse.Namespace) else args.items()
    out = {}
    for key, value in items:
        if isinstance(value, Path):
            value = str(value)
        elif not (value is None or isinstance(value, (bool, int, float, str))):
            value = repr(value)
        out[key] = value
    return out


def label_names(source, *, num_classes: int, sample: bool) -> list[str]:
    """The class names in label order: an ImageFolder's folders, the sample set's photos (``sample``:
    no ``--data``), else the label numbers (TFRecord, RecordIO and file lists carry no names)."""
    if source.classes:
        return list(source.classes)
    if sample:
        from crossdali.common.data.sample_data import class_names

        return class_names()
    return [str(i) for i in range(num_classes)]


def improved(value: float | None, best: float | None, *, higher_is_better: bool = True) -> bool:
    """``value`` (finite) beats ``best`` (None: nothing yet). A tie keeps the earlier epoch, as in
    PyTorch's ``Checkpointer`` and in ``summarize``."""
    if value is None or not math.isfinite(value):
        return False
    return best is None or (value > best if higher_is_better else value < best)


def checkpoint_meta(*, framework: str, arch: str, num_classes: int, class_names: Sequence[str], config: dict,
                    epoch: int, stats: Mapping[str, float], metric: str = "val_top1", task: str = "classification",
                    files: Sequence[str] = ()) -> dict:
    """What a checkpoint's weights need beside them to be used later (the keys of a PyTorch
    checkpoint's ``meta``): task, framework, arch, class names in label order, the full config
    (``plain_config``), the epochs done (``epoch``), ``metric`` and its ``value`` then, the epoch's
    val numbers, and the weight ``files``."""
    return {"format": CHECKPOINT_FORMAT, "task": task, "framework": framework, "arch": arch,
            "num_classes": num_classes, "class_names": list(class_names), "epoch": epoch, "metric": metric,
            "value": stats.get(metric), "val": {k: v for k, v in stats.items() if k.startswith("val_")},
            "files": list(files), "config": plain_config(config)}


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` to ``path`` atomically (a reader never sees half a file; a failed write is a
    ``WriteError`` naming it, and the previous file stays)."""
    write_text_atomically(path, json.dumps(data, indent=1) + "\n", what="checkpoint metadata")


class BestCheckpoint:
    """``checkpoint_best.*`` of a TensorFlow, MXNet or JAX run (PyTorch's ``Checkpointer`` keeps
    ``checkpoint_best.pth``): whenever ``metric`` beats the best so far (``improved``), the epoch's
    checkpoint files are copied to ``checkpoint_best<suffix>`` and ``checkpoint_best.json``
    (``checkpoint_meta``: ``meta`` plus the epoch and its numbers) is written beside them.

    ``meta``: ``checkpoint_meta``'s framework, arch, num_classes, class_names and config. Only the
    main rank writes (``enabled``); the run's last checkpoint, the one ``--resume`` takes, is the
    script's own.
    """

    def __init__(self, run_dir: Path, *, meta: dict, metric: str = "val_top1", higher_is_better: bool = True,
                 enabled: bool = True) -> None:
        self.run_dir, self.meta, self.metric = Path(run_dir), meta, metric
        self.higher_is_better, self.enabled = higher_is_better, enabled
        self.best: float | None = None
        self.best_epoch: int | None = None
        self.meta_path = self.run_dir / f"{BEST_CHECKPOINT}.json"

    def resume(self, epochs_done: int) -> None:
        """A resumed run: the best so far is the best of the first ``epochs_done`` epochs in this
        folder's ``metrics.jsonl`` (none in a new folder: its first epoch is its best)."""
        path = self.run_dir / "metrics.jsonl"
        if not (self.enabled and epochs_done and path.is_file()):
            return
        done = [r for r in read_metrics(self.run_dir) if r.get("event") == "epoch" and r.get("epoch", 0) <= epochs_done]
        summary = summarize(done, metric=self.metric, higher_is_better=self.higher_is_better)
        self.best, self.best_epoch = summary["best"], summary["best_epoch"]

    def update(self, epoch: int, stats: Mapping[str, float]) -> bool:
        """Record ``stats[metric]`` of ``epoch`` (1-based) if it beats the best so far."""
        value = stats.get(self.metric)
        if not improved(value, self.best, higher_is_better=self.higher_is_better):
            return False
        self.best, self.best_epoch = value, epoch
        return True

    def save(self, files: Mapping[str, Path], *, epoch: int, stats: Mapping[str, float]) -> Path | None:
        """Copy ``files`` ({suffix: the epoch's checkpoint file}, in that order) to
        ``checkpoint_best<suffix>`` and write ``checkpoint_best.json`` last; returns its path."""
        if not self.enabled:
            return None
        names = []
        for suffix, src in files.items():
            dst = self.run_dir / f"{BEST_CHECKPOINT}{suffix}"
            with open(src, "rb") as f:
                write_atomically(dst, lambda out, f=f: shutil.copyfileobj(f, out), what="checkpoint")
            names.append(dst.name)
        write_json(self.meta_path, checkpoint_meta(**self.meta, epoch=epoch, stats=stats, metric=self.metric,
                                                   files=names))
        log.debug("saved %s (epoch %d, %s %s)", self.meta_path, epoch, self.metric, stats.get(self.metric))
        return self.meta_path


class StepLog:
    """One epoch's per-step bookkeeping for the scripts that run their own loop (TensorFlow, MXNet,
    JAX): the ``step`` record of ``metrics.jsonl`` (what the summary and the plot read) and the
    progress bar or lines. PyTorch's ``StepTracker`` does the same, plus mid-epoch checkpoints."""

    def __init__(self, metrics: MetricsWriter, *, epoch: int, epochs: int, total: int, world_size: int = 1,
                 enabled: bool = True, print_freq: int = 10, unit: str = "img") -> None:
        self.metrics, self.epoch, self.world_size, self.step = metrics, epoch, world_size, 0
        self.progress = EpochProgress(total=total, desc=f"epoch {epoch + 1}/{epochs}", enabled=enabled,
                                      print_freq=print_freq, unit=unit)

    def update(self, *, loss: float, lr: float, samples: int, step_seconds: float, data_wait_seconds: float) -> None:
        """A step done: its loss and lr, this rank's samples, its time (data wait included) and data wait."""
        self.step += 1
        samples *= self.world_size
        self.metrics.write(event="step", epoch=self.epoch + 1, step=self.step, loss=loss, lr=lr, samples=samples,
                           step_s=step_seconds, data_wait_s=data_wait_seconds)
        self.progress.update(loss=loss, lr=lr, samples=samples, step_seconds=step_seconds,
                             data_wait_seconds=data_wait_seconds)

    def close(self) -> None:
        self.progress.close()


class ReadBehind:
    """A training loop's step losses read late, for the loops that launch steps asynchronously (JAX, Keras):
    call ``launched`` right after launching each step and ``finish`` after the last.

    ``every=1`` reads each loss once the next step is launched: in JAX that read waits for its own step only, so
    the GPU keeps the new step queued while the host fetches the next batch. TensorFlow's copy of a tensor to the
    host waits for everything queued on its compute stream, the step just launched too, so there each read leaves
    the GPU idle while the host launches the next step; ``every=N`` reads the losses in blocks of N (the newest step
    still queued), one such wait per N steps (docs/tensorflow.md#on-the-gpu). Every step is logged
    once with its own loss; the steps of a block share the block's time equally, so step times still tile the epoch
    (the last one's until its loss is read). PyTorch's ``StepTracker`` does the same through pinned memory."""

    def __init__(self, steps: StepLog, *, every: int = 1) -> None:
        if every < 1:
            raise ValueError(f"every={every}: read the losses every 1 or more steps")
        self.steps, self.every, self.loss_sum, self.seen = steps, every, 0.0, 0
        self._pending: list[list] = []  # [loss, samples, data wait, seconds, lr] of the steps not read yet
        self._last = time.perf_counter()

    def launched(self, loss, *, samples: int, lr: float, data_wait_seconds: float) -> None:
        now = time.perf_counter()
        self._pending.append([loss, samples, data_wait_seconds, now - self._last, lr])
        self._last = now
        if len(self._pending) > self.every:  # read all but the step just launched
            block, self._pending = self._pending[:-1], self._pending[-1:]
            self._record(block)

    def finish(self) -> None:
        if not self._pending:
            return
        block, self._pending = self._pending, []
        block[-1][0] = float(block[-1][0])  # waits for the last step, whose time runs until then
        block[-1][3] += time.perf_counter() - self._last
        self._record(block)

    def _record(self, block: list[list]) -> None:
        values = [float(step[0]) for step in block]  # the first read waits; the block's results are then there
        seconds = sum(step[3] for step in block) / len(block)
        for value, (_, n, wait, _, lr) in zip(values, block, strict=True):
            self.loss_sum, self.seen = self.loss_sum + value * n, self.seen + n
            self.steps.update(loss=value, lr=lr, samples=n, step_seconds=seconds, data_wait_seconds=wait)


def epoch_line(epoch: int, epochs: int, stats: dict, *, unit: str = "img") -> str:
    """The epoch's log line with the run's ETA (the epochs left at this epoch's train + eval time)."""
    line = format_epoch_line(epoch, epochs, stats, unit=unit)
    left = epochs - epoch - 1
    if left:
        line += f"  eta {format_duration(left * (stats.get('train_seconds', 0.0) + stats.get('eval_seconds', 0.0)))}"
    return line


def summarize(records: list[dict], *, metric: str, higher_is_better: bool = True) -> dict:
    """The numbers of a finished run from its ``metrics.jsonl`` records: best and last ``metric``,
    epochs, wall time of training and evaluation, mean samples/s and data-wait share."""
    epochs = latest_records(records, "epoch")
    steps = latest_records(records, "step")
    scored = [e for e in epochs if isinstance(e.get(metric), (int, float)) and math.isfinite(e[metric])]
    best = (max if higher_is_better else min)(scored, key=lambda e: e[metric]) if scored else None
    train_s = sum(e.get("train_seconds", 0.0) for e in epochs)
    eval_s = sum(e.get("eval_seconds", 0.0) for e in epochs)
    samples = sum(e.get("train_samples", 0) for e in epochs)
    wait = sum(s.get("data_wait_s", 0.0) for s in steps)
    busy = sum(s.get("step_s", 0.0) for s in steps)
    return {
        "metric": metric, "epochs": len(epochs),
        "best": best[metric] if best else None, "best_epoch": best["epoch"] if best else None,
        "last": epochs[-1].get(metric) if epochs else None,
        "train_seconds": train_s, "eval_seconds": eval_s,
        "mean_samples_s": samples / train_s if train_s else None,
        "data_wait_pct": 100 * wait / busy if busy else None,
    }


def format_summary(summary: dict, *, run_dir: Path, files: list[str], unit: str = "img") -> str:
    """The lines a person reads at the end of a run."""
    epochs = f"{summary['epochs']} epoch{'' if summary['epochs'] == 1 else 's'}"
    lines = [f"done: {epochs}, {format_duration(summary['train_seconds'])} training + "
             f"{format_duration(summary['eval_seconds'])} evaluation"]
    if summary["best"] is not None:
        lines.append(f"  best {summary['metric']} {summary['best']:.4g} (epoch {summary['best_epoch']}), "
                     f"last {summary['last']:.4g}")
    if summary["mean_samples_s"] is not None:
        wait = summary["data_wait_pct"]
        lines.append(f"  mean {summary['mean_samples_s']:,.1f} {unit}/s" +
                     (f", {wait:.{0 if wait >= 10 else 1}f} % of step time waiting for data" if wait is not None else ""))
    lines.append(f"  outputs in {run_dir}: {', '.join(files)}")
    return "\n".join(lines)


def plot_run(run_dir: Path | str) -> Path:
    """Plot a run's curves from ``<run_dir>/metrics.jsonl`` into ``<run_dir>/curves.png`` and return
    its path: loss (train per step and epoch, val per epoch), the val metric (top-1 or mAP),
    samples/s and data wait per step."""
    run_dir = Path(run_dir)
    if not (run_dir / "metrics.jsonl").is_file():
        raise UsageError(f"{run_dir} has no metrics.jsonl: pass the folder a training run wrote (its --output-dir)")
    try:
        import matplotlib  # defer: only plotting needs it
    except ImportError:
        raise ImportError("plotting a run needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(run_dir)
    steps, epochs = latest_records(records, "step"), latest_records(records, "epoch")
    per_epoch = max((s.get("step", 0) for s in steps), default=0) or 1
    x = [(s["epoch"] - 1) + s["step"] / per_epoch for s in steps]  # fractional epochs
    ex = [e["epoch"] for e in epochs]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), layout="constrained")
    ax = axes[0][0]
    if steps:
        ax.plot(x, [s["loss"] for s in steps], lw=0.6, alpha=0.5, label="train (step)")
    if any("train_loss" in e for e in epochs):
        ax.plot(ex, [e.get("train_loss") for e in epochs], "o-", label="train (epoch)")
    if any("val_loss" in e for e in epochs):
        ax.plot(ex, [e.get("val_loss") for e in epochs], "s-", label="val")
    ax.set(title="loss", xlabel="epoch", yscale="log")
    ax.legend()
    ax = axes[0][1]
    for key, label in (("val_top1", "val top-1 (%)"), ("val_top5", "val top-5 (%)"), ("val_map", "val mAP"),
                       ("val_map50", "val mAP@0.5"), ("val_f1", "val macro F1 (%)")):
        pts = [(e["epoch"], e[key]) for e in epochs if key in e]
        if pts:
            ax.plot(*zip(*pts), "o-", label=label)
    ax.set(title="validation", xlabel="epoch")
    if ax.lines:
        ax.legend()
    ax = axes[1][0]
    if steps:
        ax.plot(x, [s["samples"] / s["step_s"] if s.get("step_s") else float("nan") for s in steps], lw=0.6)
    ax.set(title="samples/s (all ranks, per step)", xlabel="epoch")
    ax = axes[1][1]
    if steps:
        ax.plot(x, [1000 * s.get("data_wait_s", 0.0) for s in steps], lw=0.6)
    ax.set(title="data wait per step (ms, rank 0)", xlabel="epoch")
    start = next((r for r in records if r.get("event") == "start"), {})
    fig.suptitle(f"{run_dir.name}: {start.get('arch', '')} on {start.get('backend', '')}, "
                 f"{start.get('world_size', 1)} process(es)")
    out = run_dir / PLOT_NAME
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def finish_run(run_dir: Path, *, metrics, metric: str, higher_is_better: bool = True, unit: str = "img") -> dict:
    """The end of a training run (rank 0): the ``summary`` record, the plot, and the summary lines."""
    run_dir = Path(run_dir)
    summary = summarize(read_metrics(run_dir), metric=metric, higher_is_better=higher_is_better)
    metrics.write(event="summary", **summary)
    try:
        plot_run(run_dir)
    except ImportError as e:
        log.warning("no plot of the curves: %s", e)
    files = sorted(p.name for p in run_dir.iterdir() if p.is_file() and not p.name.startswith("."))
    log.info(format_summary(summary, run_dir=run_dir, files=files, unit=unit))
    return summary
