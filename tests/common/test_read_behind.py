"""``ReadBehind``: the JAX and Keras loops read a step's loss only after launching the next step (so the GPU
keeps a step queued), and every step is still logged once with its own loss, rate, samples and time."""

from __future__ import annotations

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
