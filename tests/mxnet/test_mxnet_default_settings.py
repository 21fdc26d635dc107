"""The Gluon classification script with the settings left to the machine (no --amp, -b, -j): on the
CPU it trains in float32 with today's batch and threads, and records what it resolved them to."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from crossdali.common.scripts.metrics import read_metrics

pytest.importorskip("mxnet")

pytestmark = [pytest.mark.slow, pytest.mark.mxnet]


def test_a_cpu_run_with_the_defaults_trains_and_records_them(tmp_path, data_root, tiny_classification):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "crossdali.mxnet.train_classification", "--sample-size", "tiny",
                           "--arch", "mobilenet0.25", "--crop-size", "32", "--epochs", "1", "--print-freq", "0",
                           "--output-dir", str(out)],
                          env={**os.environ, "CROSSDALI_DATA": str(data_root), "OMP_NUM_THREADS": "2"},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "amp off (auto), memory format NCHW, batch 128 per process (auto), lr 0.05 = 0.1 x 128/256" in proc.stderr
    assert "--amp: not applied" not in proc.stderr  # nothing asked for, nothing to refuse
    start, = [r for r in read_metrics(out) if r["event"] == "start"]
    assert (start["amp"], start["precision"], start["memory_format"], start["batch_size"], start["workers"]) == \
        (False, "float32", "NCHW", 128, 4)
    assert (start["lr"], start["lr_rule"]) == (0.05, "0.1 x 128/256")
