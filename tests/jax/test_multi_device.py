"""Data-parallel JAX on the CPU: two host devices forced in a fresh process
(``XLA_FLAGS=--xla_force_host_platform_device_count=2`` must be set before JAX starts, so every case
runs in a subprocess), and two processes joined by ``jax.distributed`` on the loopback.

- the sharded loader: every batch one array split over the devices, each device's part its own shard;
  val sees every sample exactly once (padding rows labelled ``PADDING_LABEL``), train's shards disjoint;
- the sharded train step equals one device given each device's half of the global batch, batch norm on
  that half's statistics, the halves averaged (loss, weights, running statistics);
- the training script on 2 devices, and under a launcher as 2 processes of 1 device each: the same
  losses and val numbers, every val sample once, only process 0 writing.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.jax]

HERE = Path(__file__).resolve()
TIMEOUT = 600
# small_cnn at 32x32, 33 images per device: 4 steps of 66 over the 264 train images (every one used),
# and one val batch per device whose padding rows carry PADDING_LABEL (val shards of 27 and 28)
SCRIPT_ARGS = ["--sample-size", "tiny", "--arch", "small_cnn", "--crop-size", "32", "-b", "33", "--lr", "0.8",
               "-j", "2", "--print-freq", "0", "--data-backend", "dali-cpu", "--epochs", "1"]


def _env(tmp_path: Path, data_root: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_FLAGS", "JAX_"))}
    env.update(CROSSDALI_DATA=str(data_root), JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=str(tmp_path / "xla"),
               **extra)
    return env


def _run_case(case: str, tmp_path: Path, data_root: Path) -> dict:
    """This module's ``case`` in a process that sees 2 CPU devices; its JSON result."""
    out = tmp_path / f"{case}.json"
    env = _env(tmp_path, data_root, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    proc = subprocess.run([sys.executable, str(HERE), case, str(out)], env=env, capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, f"{case} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(out.read_text())


# -- what the subprocesses run ----------------------------------------------------------------------

def loader_case() -> dict:
    """The sharded loader over the indexed val set (label = sample index) and the step on its batches."""
    import jax
    import numpy as np

    from crossdali.common.data.sample_data import ensure_classification
    from crossdali.common.data.sources import DataSource, resolve_source, scan_image_folder
    from crossdali.jax.loaders import PADDING_LABEL, create_classification_loader
    from crossdali.jax.parallel import batch_sharding, replicate, replicated

    assert jax.device_count() == 2, jax.devices()
    root = ensure_classification(size="tiny")
    src = scan_image_folder(root / "imagefolder" / "val")
    indexed = DataSource(format="filelist", root=src.root, files=src.files, labels=tuple(range(src.num_samples)),
                         num_samples=src.num_samples)
    sharding = batch_sharding()
    val = create_classification_loader(indexed, train=False, batch_size=8, crop_size=16, workers=1, sharding=sharding)
    result: dict = {"val_len": len(val), "val_epochs": [], "shard_shapes": None}
    for _ in range(2):  # the second epoch too (the val reader moves to the next shard)
        per_device: list[list[int]] = [[], []]
        for images, labels in val:
            assert images.shape == (16, 16, 16, 3) and labels.shape == (16,), (images.shape, labels.shape)
            assert images.sharding == sharding and labels.sharding == sharding
            shards = sorted(images.addressable_shards, key=lambda s: s.device.id)
            result["shard_shapes"] = [list(s.data.shape) for s in shards]
            assert [s.device for s in shards] == list(sharding.mesh.devices.flat)
            for k, part in enumerate(sorted(labels.addressable_shards, key=lambda s: s.device.id)):
                per_device[k] += [int(i) for i in np.asarray(part.data) if i != PADDING_LABEL]
        result["val_epochs"].append(per_device)

    train = create_classification_loader(indexed, train=True, batch_size=8, crop_size=16, workers=1, sharding=sharding)
    batches = [(np.asarray(im), np.asarray(lab)) for im, lab in train]
    result["train_batches"] = [b[1].tolist() for b in batches]
    result["train_len"] = len(train)

    # the sharded step against one device given each device's half of the very same global batches:
    # batch norm on each half's own statistics, the two halves' gradients, losses and statistics averaged
    import jax.numpy as jnp
    import optax

    from crossdali.jax.models import create_model
    from crossdali.jax.train_classification import TrainState, make_steps

    labels_of = resolve_source(root / "imagefolder", "val").labels  # real classes for the loss
    model = create_model("small_cnn", num_classes=11)
    variables = model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)), train=False)

    def fresh():
        return TrainState.create(apply_fn=model.apply, params=variables["params"], batch_stats=variables["batch_stats"],
                                 tx=optax.sgd(0.1, momentum=0.9))

    def half(state, images, labels):  # one device's part, written out
        def loss_fn(params):
            logits, updates = model.apply({"params": params, "batch_stats": state.batch_stats}, images, train=True,
                                          mutable=["batch_stats"])
            targets = optax.smooth_labels(jax.nn.one_hot(labels, 11), 0.1)
            return optax.softmax_cross_entropy(logits, targets).mean(), updates["batch_stats"]
        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        return loss, stats, grads

    train_step, _ = make_steps(model, num_classes=11, label_smoothing=0.1, sharding=sharding)
    states = {"sharded": replicate(fresh(), replicated(sharding)), "one": jax.device_put(fresh(), jax.devices()[0])}
    losses: dict[str, list[float]] = {"sharded": [], "one": []}
    for images, index in batches:
        labels = np.asarray([labels_of[i] for i in index], np.int32)
        states["sharded"], loss = train_step(states["sharded"], jax.device_put(images, sharding),
                                             jax.device_put(labels, sharding))
        losses["sharded"].append(float(loss))
        n = len(labels) // 2  # the first half is the first device's (batch_sharding's order)
        parts = [half(states["one"], images[:n], labels[:n]), half(states["one"], images[n:], labels[n:])]
        loss, stats, grads = jax.tree_util.tree_map(lambda a, b: (a + b) / 2, *parts)
        states["one"] = states["one"].apply_gradients(grads=grads, batch_stats=stats)
        losses["one"].append(float(loss))
    result["losses"] = losses
    flat = {n: np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(jax.device_get((s.params, s.batch_stats)))])
            for n, s in states.items()}
    result["max_param_diff"] = float(np.max(np.abs(flat["sharded"] - flat["one"])))
    result["max_param"] = float(np.max(np.abs(flat["one"])))
    whole = make_steps(model, num_classes=11, label_smoothing=0.1)[0]  # batch norm over the global batch instead
    result["global_bn_loss"] = float(whole(jax.device_put(fresh(), jax.devices()[0]), batches[0][0],
                                           np.asarray([labels_of[i] for i in batches[0][1]], np.int32))[1])
    result["params_replicated"] = all(x.sharding.is_fully_replicated for x in jax.tree_util.tree_leaves(states["sharded"].params))
    return result


def script_case(out_dir: str) -> dict:
    """The training script itself on the 2 devices of this process."""
    from crossdali.jax.train_classification import get_args_parser, main

    stats = main(get_args_parser().parse_args([*SCRIPT_ARGS, "--output-dir", out_dir]))
    return {"stats": stats}


if __name__ == "__main__":
    case, out = sys.argv[1], Path(sys.argv[2])
    found = loader_case() if case == "loader" else script_case(str(out.with_suffix("")))
    out.write_text(json.dumps(found))


# -- the tests --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_sharded_loader_and_step_on_two_devices(tmp_path, data_root, tiny_classification, indexed_val_source,
                                                assert_epoch_coverage):
    found = _run_case("loader", tmp_path, data_root)
    # val: 55 samples in shards of 27 and 28, 8 a device: 4 steps, each one array of 16 rows split 8 + 8
    assert found["val_len"] == 4 and found["shard_shapes"] == [[8, 16, 16, 3], [8, 16, 16, 3]]
    for epoch in found["val_epochs"]:
        assert_epoch_coverage(epoch, indexed_val_source.num_samples)
        assert sorted(len(part) for part in epoch) == [27, 28]
    # train: DROP, 27 // 8 = 3 full steps on each device, the devices' samples disjoint, none twice
    assert found["train_len"] == len(found["train_batches"]) == 3
    seen = [i for batch in found["train_batches"] for i in batch]
    assert all(len(b) == 16 for b in found["train_batches"]) and len(set(seen)) == len(seen) == 48
    # split over two devices: the losses, weights and running statistics of one device given each
    # device's half and averaging, batch norm on each half's own statistics (as DDP)
    assert found["params_replicated"]
    assert found["losses"]["sharded"] == pytest.approx(found["losses"]["one"], rel=1e-5, abs=1e-6)
    assert found["max_param_diff"] <= 1e-5 * max(1.0, found["max_param"]), found
    assert found["global_bn_loss"] != pytest.approx(found["losses"]["sharded"][0], rel=1e-4)  # the halves tell


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_script_on_two_devices_and_two_processes(tmp_path, data_root, tiny_classification, assert_finished_run):
    """The script on the 2 devices of one process, then as 2 processes of 1 device each started as
    torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT; jax.distributed's coordinator
    on the next port): the same shards, hence the same losses and val numbers."""
    from crossdali.common.scripts.metrics import read_metrics

    one = _run_case("script", tmp_path, data_root)["stats"]
    assert one["train_samples"] == 264 and one["val_samples"] == 55  # every sample once
    records = assert_finished_run(tmp_path / "script", epochs=1, framework="jax")
    assert records[0]["devices"] == 2 and records[0]["world_size"] == 1
    assert [r["samples"] for r in records if r["event"] == "step"] == [66] * 4

    out = tmp_path / "two-processes"
    port = _free_port()
    procs = []
    for rank in range(2):
        env = _env(tmp_path, data_root, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port - 1))
        procs.append(subprocess.Popen([sys.executable, "-m", "crossdali.jax.train_classification", *SCRIPT_ARGS,
                                       "--output-dir", str(out)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=TIMEOUT)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n\n".join(log[-4000:] for log in logs)
    assert "jax.distributed: process 0 of 2" in logs[0] and "2 devices of 2 process(es)" in logs[0]
    records = assert_finished_run(out, epochs=1, framework="jax")
    assert records[0]["devices"] == 2 and records[0]["world_size"] == 2
    epoch = [r for r in read_metrics(out) if r["event"] == "epoch"][-1]
    assert epoch["train_samples"] == 264 and epoch["val_samples"] == 55
    for key in ("train_loss", "val_loss", "val_top1"):
        assert epoch[key] == pytest.approx(one[key], rel=1e-4), key
    assert not list(out.glob(".worker*"))  # process 1 wrote nothing


def test_coordinator_from_the_launcher_or_one_line_asking_for_it():
    """jax.distributed's coordinator: JAX's own variable first, torchrun's MASTER_ADDR with the port after
    MASTER_PORT (torchrun's store holds that one), else JAX's cluster detection, else one line with the fix."""
    from crossdali.common.distributed import DistInfo, detect_distributed
    from crossdali.common.errors import UsageError
    from crossdali.jax.parallel import coordinator_address, initialize_distributed

    torchrun = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500"}
    dist = detect_distributed(torchrun)
    assert coordinator_address(dist, torchrun) == "10.0.0.5:29501"
    assert coordinator_address(dist, {**torchrun, "JAX_COORDINATOR_ADDRESS": "h:7"}) == "h:7"
    horovod = {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "0"}
    dist = detect_distributed(horovod)
    assert coordinator_address(dist, horovod) is None
    with pytest.raises(UsageError, match="export JAX_COORDINATOR_ADDRESS=HOST:PORT"):
        initialize_distributed(dist, horovod)
    initialize_distributed(DistInfo(), {})  # one process: nothing to start


def _gpus() -> list:
    import jax

    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


@pytest.mark.gpu
@pytest.mark.slow
def test_dali_gpu_over_two_gpus(tiny_classification, indexed_val_source, assert_epoch_coverage, data_root, monkeypatch,
                                tmp_path):
    """On a machine with 2 GPUs: each device's part of a dali-gpu batch decoded on that GPU, val every sample
    once, and the script training on both GPUs by default."""
    pytest.importorskip("jax")
    gpus = _gpus()
    if len(gpus) < 2:
        pytest.skip(f"needs 2 GPUs visible to JAX (it sees {len(gpus)})")
    import numpy as np

    from crossdali.jax.loaders import PADDING_LABEL, create_classification_loader
    from crossdali.jax.parallel import batch_sharding

    sharding = batch_sharding(gpus[:2])
    val = create_classification_loader(indexed_val_source, train=False, backend="dali-gpu", batch_size=8,
                                       crop_size=64, workers=2, sharding=sharding)
    per_device: list[list[int]] = [[], []]
    for images, labels in val:
        assert images.shape == (16, 64, 64, 3) and images.sharding == sharding
        for k, (im, lab) in enumerate(zip(sorted(images.addressable_shards, key=lambda s: s.device.id),
                                          sorted(labels.addressable_shards, key=lambda s: s.device.id), strict=True)):
            assert im.device == gpus[k] and lab.device == gpus[k] and im.data.shape == (8, 64, 64, 3)
            per_device[k] += [int(i) for i in np.asarray(lab.data) if i != PADDING_LABEL]
    assert_epoch_coverage(per_device, indexed_val_source.num_samples)

    from crossdali.jax.train_classification import get_args_parser, main

    monkeypatch.setenv("CROSSDALI_DATA", str(data_root))
    stats = main(get_args_parser().parse_args([*SCRIPT_ARGS[:-3], "dali-gpu", "--epochs", "1", "--output-dir",
                                               str(tmp_path)]))
    assert stats["train_samples"] == 264 and stats["val_samples"] == 55


def test_multi_gpu_benchmark_smoke_with_jax(tmp_path, data_root, tiny_classification):
    """benchmarks/multi_gpu.py --framework jax on the CPU: the real JAX script on 1 and 2 forced host devices,
    one process each; the 2-device run steps over half as many global batches, sees every val sample once,
    and gets a scaling efficiency against the 1-device run; ``--script-args`` reaches the script (its -j
    after the benchmark's own) and is recorded."""
    env = {**_env(tmp_path, data_root), "OMP_NUM_THREADS": "2"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.multi_gpu", "--smoke", "--framework", "jax", "--out",
                           str(tmp_path / "out"), "--script-args", "-j 2"], cwd=HERE.parents[2], env=env,
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "multi_gpu.json").read_text())
    assert report["meta"]["framework"] == "jax"
    one, two = report["results"]
    for r in (one, two):
        assert "failed" not in r, r.get("failed")
        assert r["launcher"] == r["engine"] == "jax" and r["img_s"] > 0 and r["steady_img_s"] > 0
        assert r["val_samples_last"] == report["meta"]["val_images"]  # each val sample once over both devices
        assert r["script_args"] == "-j 2" and r["workers"] == 2, r  # the smoke's own -j is 1
    assert (one["gpus"], two["gpus"]) == (1, 2)
    assert one["steady_steps"] > two["steady_steps"] > 0  # a step of 2 devices takes twice the samples
    assert two["scaling_efficiency"] > 0
