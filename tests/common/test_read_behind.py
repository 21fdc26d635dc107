"""``ReadBehind``: the JAX and Keras loops read a step's loss only after launching the next step (so the GPU
keeps a step queued), and every step is still logged once with its own loss, rate, samples and time."""

from __future__ import annotations

import pytest

from crossdali.common.scripts.metrics import MetricsWriter, read_metrics
from crossdali.common.scripts.runs import ReadBehind, StepLog


class _Loss:
    """A step's result whose read is logged: ``float()`` is where a framework would wait for the step."""

    def __init__(self, value: float, reads: list[str]) -> None:
        self.value, self.reads = value, reads

    def __float__(self) -> float:
        self.reads.append(f"read {self.value:g}")
        return self.value


def test_a_loss_is_read_after_the_next_step_is_launched(tmp_path):
    metrics = MetricsWriter(tmp_path)
    events: list[str] = []
    losses = ReadBehind(StepLog(metrics, epoch=0, epochs=1, total=3, enabled=False))
    for k, n in enumerate([4, 4, 2]):
        events.append(f"launch {k}")
        losses.launched(_Loss(float(k), events), samples=n, lr=0.1 * (k + 1), data_wait_seconds=0.001 * k)
    events.append("end")
    losses.finish()
    metrics.close()
    assert events == ["launch 0", "launch 1", "read 0", "launch 2", "read 1", "end", "read 2"]
    records = [r for r in read_metrics(tmp_path) if r["event"] == "step"]
    assert [(r["loss"], r["samples"], r["data_wait_s"]) for r in records] == [(0.0, 4, 0.0), (1.0, 4, 0.001),
                                                                               (2.0, 2, 0.002)]
    assert [round(r["lr"], 6) for r in records] == [0.1, 0.2, 0.3]
    assert all(r["step_s"] >= 0 for r in records)
    assert losses.seen == 10 and losses.loss_sum == 0 * 4 + 1 * 4 + 2 * 2
    losses.finish()  # a second finish records nothing more
    assert losses.seen == 10


def test_losses_read_in_blocks_keep_the_newest_step_queued(tmp_path):
    """``every=3`` (the Keras script's ``--read-loss-every 3``): three losses read together once a fourth step is
    launched, each step still logged once with its own loss, and the steps of a block sharing its time."""
    metrics = MetricsWriter(tmp_path)
    events: list[str] = []
    losses = ReadBehind(StepLog(metrics, epoch=0, epochs=1, total=5, enabled=False), every=3)
    for k in range(5):
        events.append(f"launch {k}")
        losses.launched(_Loss(float(k), events), samples=2, lr=0.1, data_wait_seconds=0.0)
    events.append("end")
    losses.finish()
    metrics.close()
    assert events == ["launch 0", "launch 1", "launch 2", "launch 3", "read 0", "read 1", "read 2", "launch 4", "end",
                      "read 4", "read 3"]
    records = [r for r in read_metrics(tmp_path) if r["event"] == "step"]
    assert [r["loss"] for r in records] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert len({r["step_s"] for r in records[:3]}) == 1 and len({r["step_s"] for r in records[3:]}) == 1
    assert losses.seen == 10 and losses.loss_sum == 2 * (0 + 1 + 2 + 3 + 4)


def test_every_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="every=0"):
        ReadBehind(StepLog(MetricsWriter(tmp_path), epoch=0, epochs=1, total=1, enabled=False), every=0)
