"""The framework-free parts of a run (crossdali.common: runs, metrics, progress, script), which the
TensorFlow and MXNet scripts can adopt as they are: the run folder, the summary of a resumed run,
the plot from metrics.jsonl, the progress bar and lines, and how a script ends (user error, stop,
bug). No framework is imported here."""

from __future__ import annotations

import argparse
import io
import json
import logging
import time
from pathlib import Path

import pytest

from crossdali.common.errors import DataError, UsageError
from crossdali.common.scripts.metrics import MetricsWriter, format_test_line, latest_records, read_metrics, topk_for, val_stats
from crossdali.common.scripts.progress import EpochProgress, format_duration
from crossdali.common.scripts.runs import choose_run_dir, default_run_dir, plain_config, plot_run, summarize
from crossdali.common.scripts.script import TrainingStopped, run


def test_run_folder_names(tmp_path):
    now = time.mktime((2026, 11, 23, 18, 4, 5, 0, 0, -1))
    first = default_run_dir(task="video", framework="pytorch", arch="small3d", root=tmp_path, now=now)
    assert first == tmp_path / "video-pytorch-small3d-20261123-180405"
    first.mkdir()
    assert default_run_dir(task="video", framework="pytorch", arch="small3d", root=tmp_path, now=now).name.endswith("-2")
    assert choose_run_dir(tmp_path / "o", resume=tmp_path / "r/c.pth", task="t", framework="f", arch="a") == tmp_path / "o"
    assert choose_run_dir(None, resume=tmp_path / "r/c.pth", task="t", framework="f", arch="a") == tmp_path / "r"
    assert plain_config(argparse.Namespace(data=Path("/d"), lr=0.1, amp=True, resume=None, x=(1, 2))) == {
        "data": "/d", "lr": 0.1, "amp": True, "resume": None, "x": "(1, 2)"}


def test_top_k_only_below_the_class_count():
    assert topk_for(1000) == (1, 5) and topk_for(6) == (1, 5) and topk_for(5) == (1,) and topk_for(3) == (1,)
    # the TensorFlow, MXNet and JAX scripts' evaluation record follows the same rule
    six = val_stats(loss_sum=11.0, correct1=3, correct5=8, seen=10, num_classes=6)
    assert six == {"val_loss": 1.1, "val_top1": 30.0, "val_samples": 10, "val_top5": 80.0}
    five = val_stats(loss_sum=11.0, correct1=3, correct5=10, seen=10, num_classes=5)
    assert "val_top5" not in five and five["val_top1"] == 30.0
    assert format_test_line(five) == "test: val loss 1.1000 top1 30.00 over 10 samples"
    assert format_test_line(six).endswith("top1 30.00 top5 80.00 over 10 samples")


def _write_resumed_run(run_dir: Path) -> None:
    """A run killed after epoch 1, step 2 (checkpoint at step 1) and resumed: step 2 is redone."""
    m = MetricsWriter(run_dir)
    m.write(event="start", arch="resnet18", backend="dali-cpu", world_size=1)
    for step, loss in ((1, 2.0), (2, 1.9)):
        m.write(event="step", epoch=1, step=step, loss=loss, lr=0.1, samples=8, step_s=0.5, data_wait_s=0.1)
    m.write(event="start", arch="resnet18", backend="dali-cpu", world_size=1, resumed_from="c.pth")
    for epoch, step, loss in ((1, 2, 1.8), (1, 3, 1.7), (2, 1, 1.5), (2, 2, 1.4), (2, 3, 1.3)):
        m.write(event="step", epoch=epoch, step=step, loss=loss, lr=0.1, samples=8, step_s=0.5, data_wait_s=0.1)
        if step == 3:
            m.write(event="epoch", epoch=epoch, train_loss=loss, val_loss=loss + 0.1, val_top1=[40.0, 35.0][epoch - 1],
                    train_seconds=1.5, eval_seconds=0.5, train_samples=24)
    m.close()


def test_summary_and_plot_of_a_resumed_run(tmp_path):
    _write_resumed_run(tmp_path)
    records = read_metrics(tmp_path)
    steps = latest_records(records, "step")
    assert [(s["epoch"], s["step"], s["loss"]) for s in steps][:3] == [(1, 1, 2.0), (1, 2, 1.8), (1, 3, 1.7)]
    summary = summarize(records, metric="val_top1")
    assert summary == {"metric": "val_top1", "epochs": 2, "best": 40.0, "best_epoch": 1, "last": 35.0,
                       "train_seconds": 3.0, "eval_seconds": 1.0, "mean_samples_s": 16.0,
                       "data_wait_pct": pytest.approx(20.0)}
    png = plot_run(tmp_path)
    assert png == tmp_path / "curves.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(UsageError, match="has no metrics.jsonl"):
        plot_run(tmp_path / "empty")


def test_progress_lines_when_logged_and_a_bar_on_a_terminal(caplog):
    caplog.set_level(logging.INFO, logger="crossdali.progress")
    lines = EpochProgress(total=6, desc="epoch 1/2", print_freq=3, bar=False)
    for _ in range(6):
        lines.update(loss=1.5, lr=0.1, samples=16, step_seconds=0.5, data_wait_seconds=0.05)
    lines.close()
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 2 and logged[0].startswith("epoch 1/2 step 3/6  loss 1.5000  lr 0.1  32.0 img/s  data wait 10 %")
    assert " eta " in logged[0] and logged[1].endswith("eta 0:00")
    pytest.importorskip("tqdm")
    stream = io.StringIO()
    bar = EpochProgress(total=4, desc="epoch 1/1", initial=1, bar=True, stream=stream, refresh_seconds=0)
    for _ in range(3):
        bar.update(loss=0.5, lr=0.01, samples=8, step_seconds=0.25, data_wait_seconds=0.0)
    bar.close()
    text = stream.getvalue()
    assert "epoch 1/1" in text and "4/4" in text and "32 img/s" in text and "<" in text  # tqdm's [elapsed<eta]
    assert format_duration(3725) == "1:02:05" and format_duration(65) == "1:05"


def _script(exc: BaseException | None):
    parser = argparse.ArgumentParser(prog="train")
    parser.add_argument("--debug", action="store_true")

    def main(args):
        if exc is not None:
            raise exc
        return {"ok": 1}

    return main, parser


@pytest.mark.parametrize("exc, code, line", [
    (DataError("/data/x does not exist; pass --data"), 2, "train: error: /data/x does not exist; pass --data"),
    (UsageError("--resume a.pth does not exist"), 2, "train: error: --resume a.pth does not exist"),
    (TrainingStopped("stopped by SIGTERM at epoch 1, step 3; ...", signum=15), 143,
     "train: stopped by SIGTERM at epoch 1, step 3; ..."),
    (KeyboardInterrupt(), 130, "train: interrupted (no checkpoint written for the current step)"),
])
def test_how_a_script_ends(exc, code, line, capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    main, parser = _script(exc)
    with pytest.raises(SystemExit) as e:
        run(main, parser, [])
    assert e.value.code == code
    assert capsys.readouterr().err.strip().splitlines() == [line]


def test_bugs_and_debug_keep_the_traceback():
    main, parser = _script(ZeroDivisionError("a bug"))
    with pytest.raises(ZeroDivisionError):
        run(main, parser, [])
    main, parser = _script(DataError("bad data"))
    with pytest.raises(DataError):
        run(main, parser, ["--debug"])
    main, parser = _script(None)
    run(main, parser, [])  # returns normally


def test_metrics_writer_keeps_records_when_killed(tmp_path):
    m = MetricsWriter(tmp_path)
    m.write(event="step", epoch=1, step=1, loss=1.0)
    # flushed at once: another process (or the next run after a SIGKILL) reads it without close()
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["loss"] == 1.0
    m.close()
    assert MetricsWriter(tmp_path, enabled=False).path is None


def test_a_new_run_in_a_used_folder_keeps_the_old_metrics_apart(tmp_path):
    from crossdali.common.scripts.runs import open_metrics

    _write_resumed_run(tmp_path)
    old = (tmp_path / "metrics.jsonl").read_text()
    m = open_metrics(tmp_path, continuing=False)
    m.write(event="start", arch="b")
    m.close()
    moved, = tmp_path.glob("metrics.*-*.jsonl")
    assert moved.read_text() == old and [r["arch"] for r in read_metrics(tmp_path)] == ["b"]
    m = open_metrics(tmp_path, continuing=True)  # a resumed run appends
    m.write(event="start", arch="c")
    m.close()
    assert [r["arch"] for r in read_metrics(tmp_path)] == ["b", "c"]
