"""Two tf.distribute workers (MultiWorkerMirroredStrategy over gRPC on localhost, CPU): data
sharded by the worker index, gradients averaged, val exactly once across the workers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from crossdali.common.scripts.metrics import read_metrics

pytest.importorskip("tensorflow")
pytest.importorskip("nvidia.dali.plugin.tf")

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.mark.parametrize("jit", ["auto", "on"])  # auto: no XLA with tf.distribute; on: the gradients compiled
def test_two_workers_train_in_sync(data_root, tiny_classification, tmp_path, jit):
    workers = [f"localhost:{p}" for p in _free_ports(2)]
    procs = []
    for index in range(2):
        env = {**os.environ, "CROSSDALI_DATA": str(data_root), "TF_CPP_MIN_LOG_LEVEL": "2",
               "TF_CONFIG": json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})}
        cmd = [sys.executable, "-m", "crossdali.tensorflow.train_classification", "--sample-size", "tiny",
               "--arch", "small_cnn", "--crop-size", "48", "-b", "16", "--epochs", "2", "--lr", "0.4",
               "--lr-warmup-epochs", "1", "-j", "1", "--print-freq", "0", "--jit-compile", jit, "--output-dir", str(tmp_path)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-3000:]
    records = read_metrics(tmp_path)
    start = next(r for r in records if r["event"] == "start")
    assert start["engine"] == "tf-distribute" and start["world_size"] == 2
    assert start["jit_compile"] is (jit == "on")
    epochs = [r for r in records if r["event"] == "epoch"]
    assert len(epochs) == 2
    for r in epochs:
        assert r["val_samples"] == 55  # every val sample once across the two workers
        assert r["train_samples"] == 2 * (264 // 2) // 16 * 16  # DROP: equal full batches per worker
    assert next(r for r in records if r["event"] == "end")["replicas_in_sync"] is True
    assert not any(p.name.startswith(".worker") for p in tmp_path.iterdir())  # worker 1's files removed
    assert (tmp_path / "ckpt-2.index").is_file()


def test_bad_tf_config_is_a_clear_error():
    from crossdali.tensorflow.distributed import dist_from_tf_config

    with pytest.raises(ValueError, match="needs TF_CONFIG like"):
        dist_from_tf_config("{not json")
    with pytest.raises(ValueError, match="only 'worker' tasks"):
        dist_from_tf_config(json.dumps({"cluster": {"chief": ["a:1"], "worker": ["b:1"]},
                                        "task": {"type": "worker", "index": 0}}))
    info = dist_from_tf_config(json.dumps({"cluster": {"worker": ["a:1", "b:2", "c:3"]},
                                           "task": {"type": "worker", "index": 2}}))
    assert (info.rank, info.world_size, info.launcher) == (2, 3, "tf_config")
