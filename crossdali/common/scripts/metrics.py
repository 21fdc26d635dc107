"""Run logs shared by every train script: a JSON-lines file for machines, one line per epoch for
people. Only rank 0 writes.

Records (``event``): ``start`` (configuration; ``resumed_from`` when resumed), ``step`` (one per
optimizer step: loss, lr, samples, step and data-wait seconds), ``epoch`` (train and val metrics),
``test`` (``--test-only``), ``summary`` (end of training). A resumed run appends to the same file, so
a step or epoch may appear twice (the part after the last checkpoint of a killed run was redone):
``latest_records`` keeps the last of each.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import IO

from crossdali.common.errors import WriteError

__all__ = ["MetricsWriter", "discard_unstarted_runs", "format_epoch_line", "format_test_line", "latest_records",
           "read_metrics", "topk_for", "val_stats"]


def topk_for(num_classes: int, ks: tuple[int, ...] = (1, 5)) -> tuple[int, ...]:
    """The top-k accuracies worth reporting: only k < classes (top-5 of 3 classes is always 100 %,
    top-4 of 4 too), and always top-1."""
    return tuple(k for k in ks if k == 1 or k < num_classes)


def val_stats(*, loss_sum: float, correct1: float, correct5: float, seen: int, num_classes: int) -> dict[str, float]:
    """Val loss and top-1 in percent over ``seen`` samples, and top-5 only where ``topk_for`` keeps
    it: the TensorFlow, MXNet and JAX scripts' evaluation record (PyTorch's has its own top-k loop)."""
    n = max(seen, 1)
    stats = {"val_loss": loss_sum / n, "val_top1": 100 * correct1 / n, "val_samples": int(seen)}
    if 5 in topk_for(num_classes):
        stats["val_top5"] = 100 * correct5 / n
    return stats


def format_test_line(stats: dict[str, float]) -> str:
    """``test: val loss 0.9 top1 56.2 top5 90.1 over 55 samples`` (``--test-only``; multi-label:
    ``test: val loss 0.2 mAP 61.0 F1 40.3 over 55 samples``)."""
    if "val_f1" in stats:
        return (f"test: val loss {stats['val_loss']:.4f} mAP {stats['val_map']:.2f} F1 {stats['val_f1']:.2f} "
                f"over {stats['val_samples']} sample{'' if stats['val_samples'] == 1 else 's'}")
    top5 = f" top5 {stats['val_top5']:.2f}" if "val_top5" in stats else ""
    return (f"test: val loss {stats['val_loss']:.4f} top1 {stats['val_top1']:.2f}{top5} "
            f"over {stats['val_samples']} sample{'' if stats['val_samples'] == 1 else 's'}")


class MetricsWriter:
    """Appends one JSON object per record to ``<output_dir>/metrics.jsonl`` (rank 0 only).

    The file stays open and is flushed after every record, so a killed job keeps what it logged.
    """

    def __init__(self, output_dir: Path | None, *, enabled: bool = True) -> None:
        self.path = Path(output_dir) / "metrics.jsonl" if output_dir is not None and enabled else None
        self._file: IO[str] | None = None
        #: what this writer created and wrote, for ``discard_unstarted_runs``
        self.created_dirs: list[Path] = []
        self.created_file = False
        self.events: set[str] = set()
        if self.path is not None:
            self.created_dirs = [d for d in (self.path.parent, *self.path.parent.parents) if not d.exists()]
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _WRITERS.append(self)

    def write(self, **record) -> None:
        if self.path is None:
            return
        record.setdefault("time", time.time())
        try:
            if self._file is None:
                self.created_file = self.created_file or not self.path.exists()
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open between records
            self._file.write(json.dumps(record, sort_keys=True) + "\n")
            self._file.flush()
        except OSError as e:  # a full disk, a file-size limit: one line naming the file, not a traceback
            raise WriteError(f"cannot write {self.path}: {e.strerror or e}") from e
        self.events.add(str(record.get("event")))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


_WRITERS: list[MetricsWriter] = []  # this process's writers, newest last


def discard_unstarted_runs() -> list[Path]:
    """Undo the run folders of this process's writers whose run stopped on a user's mistake before it
    left anything to resume or compare (such as a bad sample found by DALI with ``--skip-check``): a
    ``metrics.jsonl`` this writer created that holds no more than the ``start`` record and the first
    epoch's ``step`` records is removed, and so are the folders it created once they are empty. A
    folder with anything else in it (a checkpoint) is left as it is. Returns what was removed."""
    removed: list[Path] = []
    while _WRITERS:
        writer = _WRITERS.pop()
        writer.close()
        if writer.path is None or not writer.created_file or writer.events - {"start", "step"}:
            continue
        folder = writer.path.parent
        if writer.created_dirs and any(p != writer.path for p in folder.iterdir()):
            continue  # something else was written there: it stays, with the metrics that explain it
        writer.path.unlink(missing_ok=True)
        removed.append(writer.path)
        for created in writer.created_dirs:  # deepest first
            try:
                created.rmdir()
            except OSError:  # not empty (or gone): leave it and its parents
                break
            removed.append(created)
    return removed


def read_metrics(output_dir: Path | str) -> list[dict]:
    """The records a ``MetricsWriter`` wrote to ``<output_dir>/metrics.jsonl``, in order."""
    path = Path(output_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def latest_records(records: list[dict], event: str) -> list[dict]:
    """The ``event`` records with the last one kept where a resumed run redid an epoch or step,
    ordered by (epoch, step)."""
    keyed: dict[tuple, dict] = {}
    for r in records:
        if r.get("event") == event:
            keyed[(r.get("epoch", 0), r.get("step", 0))] = r
    return [keyed[k] for k in sorted(keyed)]


def format_epoch_line(epoch: int, epochs: int, stats: dict[str, float], *, unit: str = "img") -> str:
    """``epoch 2/3  train loss 1.234  val loss 0.9 top1 56.2 top5 90.1  1,234 img/s  data wait 12%``"""
    parts = [f"epoch {epoch + 1}/{epochs}"]
    if "train_loss" in stats:
        parts.append(f"train loss {stats['train_loss']:.4f}")
    if "val_top1" in stats:
        val = f"val loss {stats['val_loss']:.4f} top1 {stats['val_top1']:.2f}"
        if "val_top5" in stats:
            val += f" top5 {stats['val_top5']:.2f}"
        parts.append(val)
    if "val_f1" in stats:  # multi-label classification: mAP and F1 in percent
        parts.append(f"val loss {stats['val_loss']:.4f} mAP {stats['val_map']:.2f} F1 {stats['val_f1']:.2f}")
    elif "val_map" in stats:  # detection: COCO mAP
        parts.append(f"val mAP {stats['val_map']:.4f} mAP@0.5 {stats['val_map50']:.4f}")
    if "train_img_s" in stats:
        parts.append(f"{stats['train_img_s']:,.1f} {unit}/s")
    if "data_wait_s" in stats:
        wait = f"data wait {stats['data_wait_s']:.2f} s"
        if stats.get("train_seconds"):
            wait += f" ({100 * stats['data_wait_s'] / stats['train_seconds']:.0f} %)"
        parts.append(wait)
    return "  ".join(parts)
