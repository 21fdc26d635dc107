"""Run logs shared by every train script: a JSON-lines file for machines, one line per epoch
for people. Only rank 0 writes."""

from __future__ import annotations

import json
import time
from pathlib import Path

__all__ = ["MetricsWriter", "format_epoch_line", "read_metrics"]


class MetricsWriter:
    """Appends one JSON object per record to ``<output_dir>/metrics.jsonl`` (rank 0 only)."""

    def __init__(self, output_dir: Path | None, *, enabled: bool = True) -> None:
        self.path = Path(output_dir) / "metrics.jsonl" if output_dir is not None and enabled else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, **record) -> None:
        if self.path is None:
            return
        record.setdefault("time", time.time())
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")


def read_metrics(output_dir: Path | str) -> list[dict]:
    """The records a ``MetricsWriter`` wrote to ``<output_dir>/metrics.jsonl``, in order."""
    path = Path(output_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def format_epoch_line(epoch: int, epochs: int, stats: dict[str, float]) -> str:
    """``epoch 2/3  train loss 1.234  val top1 56.2 top5 90.1  1,234 img/s  data 12% ...``"""
    parts = [f"epoch {epoch + 1}/{epochs}"]
    if "train_loss" in stats:
        parts.append(f"train loss {stats['train_loss']:.4f}")
    if "val_top1" in stats:
        parts.append(f"val loss {stats['val_loss']:.4f} top1 {stats['val_top1']:.2f} top5 {stats['val_top5']:.2f}")
    if "train_img_s" in stats:
        parts.append(f"{stats['train_img_s']:,.0f} img/s")
    if "data_wait_s" in stats:
        parts.append(f"data wait {stats['data_wait_s']:.2f} s")
    return "  ".join(parts)
