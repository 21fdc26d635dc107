"""The best checkpoint of the TensorFlow, MXNet and JAX scripts (crossdali.common.scripts.runs.BestCheckpoint):
which epoch counts as best (PyTorch's rule), what a resumed run remembers, what lands on disk.
No framework is imported here; tests/{tensorflow,jax,mxnet}/*_train.py check it on real runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from crossdali.common.scripts.metrics import MetricsWriter
from crossdali.common.scripts.runs import BEST_CHECKPOINT, BestCheckpoint, improved

META = {"framework": "f", "arch": "a", "num_classes": 2, "class_names": ["cat", "dog"],
        "config": argparse.Namespace(data=Path("/d"), lr=0.1, resume=None)}


def test_improved_is_strict_and_skips_non_finite():
    assert improved(1.0, None) and improved(2.0, 1.0) and not improved(1.0, 1.0)  # a tie keeps the earlier epoch
    assert not improved(float("nan"), None) and not improved(None, None) and not improved(float("inf"), 1.0)
    assert improved(0.5, 1.0, higher_is_better=False) and not improved(1.5, 1.0, higher_is_better=False)


def test_save_copies_the_files_and_writes_the_json(tmp_path):
    weights = tmp_path / "checkpoint.w"
    weights.write_bytes(b"epoch 2")
    best = BestCheckpoint(tmp_path, meta=META)
    stats = {"train_loss": 0.3, "val_loss": 0.4, "val_top1": 50.0}
    assert best.update(1, {"val_top1": 50.0}) and not best.update(2, stats)  # equal: epoch 1 stays
    assert best.update(3, {**stats, "val_top1": 60.0}) and (best.best, best.best_epoch) == (60.0, 3)
    best.save({".w": weights}, epoch=3, stats={**stats, "val_top1": 60.0})
    assert (tmp_path / f"{BEST_CHECKPOINT}.w").read_bytes() == b"epoch 2"
    meta = json.loads((tmp_path / f"{BEST_CHECKPOINT}.json").read_text())
    assert meta["class_names"] == ["cat", "dog"] and meta["config"] == {"data": "/d", "lr": 0.1, "resume": None}
    assert (meta["epoch"], meta["metric"], meta["value"], meta["files"]) == (3, "val_top1", 60.0, ["checkpoint_best.w"])
    assert meta["val"] == {"val_loss": 0.4, "val_top1": 60.0}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.w", "checkpoint_best.json", "checkpoint_best.w"]
    BestCheckpoint(tmp_path / "other", meta=META, enabled=False).save({".w": weights}, epoch=1, stats=stats)
    assert not (tmp_path / "other").exists()  # not the main rank: writes nothing


def test_a_resumed_run_remembers_the_best_of_the_epochs_it_keeps(tmp_path):
    metrics = MetricsWriter(tmp_path)
    for epoch, top1 in ((1, 40.0), (2, 70.0), (3, 55.0), (2, 65.0), (3, 80.0)):  # epochs 2 and 3 redone
        metrics.write(event="epoch", epoch=epoch, val_top1=top1)
    metrics.close()
    best = BestCheckpoint(tmp_path, meta=META)
    best.resume(2)  # from the redone epoch 2's checkpoint: epoch 3 is not done yet
    assert (best.best, best.best_epoch) == (65.0, 2)
    assert not best.update(3, {"val_top1": 65.0}) and best.update(3, {"val_top1": 66.0})
    fresh = BestCheckpoint(tmp_path / "new", meta=META)
    fresh.resume(2)  # resumed into another folder: its first epoch is its best
    assert fresh.best is None and fresh.update(3, {"val_top1": 1.0})
