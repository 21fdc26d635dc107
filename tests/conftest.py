"""Fixtures shared by every framework's tests.

The sample set is built once per data root (``$CROSSDALI_DATA``, which nox points at
``.cache/data`` for all sessions) so every framework reads the very same JPEG bytes.

Subprocesses (training scripts, launchers, benchmarks) must run this checkout's code: the
repository goes first on ``PYTHONPATH`` here, once for the whole session, so a test passes
``os.environ`` (plus its own variables) and never builds that path itself.
"""

from __future__ import annotations

import ast
import os
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_paths = [str(ROOT), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(filter(None, _paths)))  # repository first, no repeats


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The checkout the tests run (the working directory of the scripts they start)."""
    return ROOT


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> Path:
    env = os.environ.get("CROSSDALI_DATA")
    return Path(env) if env else tmp_path_factory.mktemp("data")


@pytest.fixture(scope="session")
def tiny_classification(data_root) -> Path:
    """The ``tiny`` classification sample set (11 classes; 264 train, 55 val samples), in every format;
    without TFRecord where the ``tfrecord`` package cannot be imported (the GPU machine's protobuf),
    so that the GPU tests, which read image files, run there."""
    from crossdali.common.data.sample_data import ensure_classification

    formats = ("imagefolder", "tfrecord", "recordio", "webdataset")
    try:
        import tfrecord  # noqa: F401
    except Exception:  # not installed, or its generated protobuf code refused by the installed protobuf
        formats = tuple(f for f in formats if f != "tfrecord")
    return ensure_classification(data_root, size="tiny", formats=formats)


@pytest.fixture(scope="module")
def s3_tiny_set(tiny_classification):
    """(endpoint, ``s3://`` URL, local folder) of the tiny set in a loopback S3 server (moto, started once per
    process: tests/common/s3_server.py), with the AWS variables set for the module's tests."""
    pytest.importorskip("moto")
    from tests.common.s3_server import tiny_set_in_store

    with tiny_set_in_store(tiny_classification) as found:
        yield found


@pytest.fixture(scope="session")
def indexed_val_source(tiny_classification):
    """An odd-sized (55) val set whose label is the sample's index: labels identify samples."""
    from crossdali.common.data.sources import DataSource, scan_image_folder

    src = scan_image_folder(tiny_classification / "imagefolder" / "val")
    assert src.num_samples % 2 == 1
    return DataSource(format="filelist", root=src.root, files=src.files,
                      labels=tuple(range(src.num_samples)), num_samples=src.num_samples)


@pytest.fixture(scope="session")
def val_items(indexed_val_source):
    """The tiny val split in memory: (JPEG bytes, sample index as label), 55 samples (the
    external-source loaders' tests, every framework)."""
    return [(Path(f).read_bytes(), label) for f, label in zip(indexed_val_source.files, indexed_val_source.labels)]


def _assert_epoch_coverage(seen_per_shard: list[list[int]], num_samples: int) -> None:
    """Every sample id in ``range(num_samples)`` seen exactly once across all shards."""
    counts = Counter(i for shard in seen_per_shard for i in shard)
    duplicated = sorted(i for i, c in counts.items() if c > 1)
    missing = sorted(set(range(num_samples)) - set(counts))
    extra = sorted(set(counts) - set(range(num_samples)))
    assert not duplicated and not missing and not extra, (
        f"epoch coverage broken: duplicated {duplicated[:10]}, missing {missing[:10]}, unknown {extra[:10]}")


@pytest.fixture(scope="session")
def assert_epoch_coverage():
    """The one check of "every sample exactly once across all shards" used for every framework."""
    return _assert_epoch_coverage


def _assert_handovers_agree(make_loader, *, outputs: tuple[str, ...], epochs: int = 2) -> list[list[tuple]]:
    """TensorFlow's two hand-overs give the same batches: ``make_loader(handover)`` is built for ``dataset``
    and ``dlpack``, each runs ``epochs`` epochs, and every output of every batch must match bit for bit and
    in dtype, in the same order. An epoch's batches are read as NumPy only once the epoch has ended, so a
    ``dlpack`` batch must stay intact while the loader makes the batches after it. Returns the ``dlpack`` epochs
    as NumPy tuples for the test's own checks."""
    import numpy as np

    got = {}
    for handover in ("dataset", "dlpack"):
        loader = make_loader(handover)
        got[handover] = [[tuple(x.numpy() for x in batch) for batch in list(loader)] for _ in range(epochs)]
        assert loader.handover == handover and loader.epoch == epochs
    assert [len(e) for e in got["dlpack"]] == [len(e) for e in got["dataset"]]
    for got_epoch, want_epoch in zip(got["dlpack"], got["dataset"], strict=True):
        for got_batch, want_batch in zip(got_epoch, want_epoch, strict=True):
            for name, g, w in zip(outputs, got_batch, want_batch, strict=True):
                assert g.dtype == w.dtype, name
                np.testing.assert_array_equal(g, w, err_msg=name)
    return got["dlpack"]


@pytest.fixture(scope="session")
def assert_handovers_agree():
    """The one "both TensorFlow hand-overs, the same batches" check of classification, detection and video."""
    return _assert_handovers_agree


def _assert_finished_run(run_dir: Path, *, epochs: int, framework: str) -> list[dict]:
    """What every training script leaves in its run folder (``crossdali.common.scripts.runs``): a start
    record, step records every epoch, one epoch record per epoch, the summary of the best epoch,
    and the curves as a PNG. Returns the records."""
    from crossdali.common.scripts.metrics import read_metrics
    from crossdali.common.scripts.runs import PLOT_NAME

    records = read_metrics(run_dir)
    assert records[0]["event"] == "start" and records[0]["framework"] == framework
    per_epoch = [r for r in records if r["event"] == "epoch"]
    assert [r["epoch"] for r in per_epoch][-epochs:] == list(range(per_epoch[-1]["epoch"] - epochs + 1,
                                                                    per_epoch[-1]["epoch"] + 1))
    steps = [r for r in records if r["event"] == "step"]
    for e in per_epoch[-epochs:]:
        mine = [s for s in steps if s["epoch"] == e["epoch"]]
        assert mine and [s["step"] for s in mine] == list(range(1, len(mine) + 1))
        assert sum(s["samples"] for s in mine) == e["train_samples"]  # every step recorded, all ranks counted
        assert all(s["step_s"] >= s["data_wait_s"] >= 0 for s in mine)
    summary = records[-1]
    assert summary["event"] == "summary" and summary["metric"] == "val_top1"
    assert summary["best"] == max(e["val_top1"] for e in per_epoch)
    assert summary["last"] == per_epoch[-1]["val_top1"] and summary["eval_seconds"] > 0
    assert (run_dir / PLOT_NAME).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return records


@pytest.fixture(scope="session")
def assert_finished_run():
    """The one check of a training run's folder, used for every framework's script."""
    return _assert_finished_run


def _assert_best_checkpoint(run_dir: Path, *, framework: str, suffixes: list[str], config: dict) -> dict:
    """The best checkpoint of a TensorFlow, MXNet or JAX run on the sample set
    (``crossdali.common.scripts.runs.BestCheckpoint``): its weight files (``checkpoint_best<suffix>``) and
    ``checkpoint_best.json``, which names the class names, the full config (``config`` among its
    values) and the epoch of the best val top-1 in ``metrics.jsonl`` (the earliest of a tie); and
    ``checkpoint.json``, the same description of the last checkpoint. Returns the best's JSON."""
    import json

    from crossdali.common.data.sample_data import class_names
    from crossdali.common.scripts.metrics import latest_records, read_metrics
    from crossdali.common.scripts.runs import BEST_CHECKPOINT, CHECKPOINT_FORMAT

    epochs = latest_records(read_metrics(run_dir), "epoch")
    best = max(epochs, key=lambda e: e["val_top1"])  # max keeps the first of equals
    meta = json.loads((run_dir / f"{BEST_CHECKPOINT}.json").read_text())
    assert (meta["format"], meta["task"], meta["framework"]) == (CHECKPOINT_FORMAT, "classification", framework)
    assert (meta["epoch"], meta["metric"], meta["value"]) == (best["epoch"], "val_top1", best["val_top1"]), epochs
    assert meta["val"]["val_loss"] == best["val_loss"]
    assert meta["class_names"] == class_names() and meta["num_classes"] == len(class_names())
    assert config.items() <= meta["config"].items() and {"lr", "batch_size", "seed", "data_backend"} <= set(meta["config"])
    assert meta["files"] == [f"{BEST_CHECKPOINT}{s}" for s in suffixes]
    assert all((run_dir / name).stat().st_size > 0 for name in meta["files"])
    # the last checkpoint (what --resume takes) is described the same way, for its own epoch
    last = json.loads((run_dir / "checkpoint.json").read_text())
    assert (last["format"], last["framework"], last["epoch"]) == (CHECKPOINT_FORMAT, framework, epochs[-1]["epoch"])
    assert last["class_names"] == meta["class_names"] and config.items() <= last["config"].items()  # a resumed
    # run's config differs from the best's in --resume and --epochs
    assert all(list(run_dir.glob(f"{name}*")) for name in last["files"])  # TensorFlow's names a prefix
    return meta


@pytest.fixture(scope="session")
def assert_best_checkpoint():
    """The one check of a TensorFlow, MXNet or JAX run's best checkpoint."""
    return _assert_best_checkpoint


HOROVOD_SCRIPT = "scripts/install-horovod"


def _nox_installs(session_name: str) -> set[tuple[str, tuple[str, ...]]]:
    """The requirement files (with pip flags) a noxfile session installs, read from its source."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        names = {node.name.replace("_", "-")}
        for deco in node.decorator_list:
            if isinstance(deco, ast.Call):
                names |= {kw.value.value for kw in deco.keywords if kw.arg == "name"}
        if session_name not in names:
            continue
        files: set[tuple[str, tuple[str, ...]]] = set()
        for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
            args = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            func = ast.unparse(call.func)
            if func == "_install":
                files.add((f"requirements/{args[0]}.txt", ()))
            elif func == "session.install":
                flags = tuple(sorted(a for a in args if a in ("--no-build-isolation", "--no-deps")))
                files |= {(args[i + 1], flags) for i, a in enumerate(args) if a == "-r"}
            elif func == "session.run" and any(HOROVOD_SCRIPT in a for a in args):
                files.add(("requirements/horovod.txt", ()))
        return files
    raise LookupError(f"noxfile.py has no session {session_name!r}")


@pytest.fixture(scope="session")
def nox_installs():
    """``nox_installs(session) -> {(requirement file, pip flags)}``: what a noxfile session installs,
    read from its source (the Dockerfiles and the README's install lines are checked against it)."""
    return _nox_installs
