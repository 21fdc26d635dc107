"""Two nodes on one host: four ranks whose local rank is not their global rank.

``torchrun --nnodes 2 --nproc_per_node 2`` runs as two node processes that meet through a c10d
rendezvous on the loopback; the same job runs again as the 4 processes ``srun`` starts for
2 nodes x 2 tasks, with its variables (``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID``, ...), and
under ``horovodrun --gloo -np 4 -H localhost:2,127.0.0.1:2`` (two host entries for this one machine;
``nox -s tests-pytorch`` builds Horovod, elsewhere that case skips). One node
hides the classic bug of sharding by the local rank (DALI's ResNet-50 example): there the local
rank is the global rank. Here ranks 2 and 3 have local ranks 0 and 1, so such a job would read
node 0's shards twice and never read the rest.

Checked, on the CPU:

- every train and val sample exactly once per epoch across the 4 ranks (labels are sample
  indices; two train epochs, so the reshuffle between epochs keeps the shards disjoint);
- each rank's DALI pipelines are shard <global rank> of 4 and use GPU <local rank> (on the CPU,
  the GPU ``dali-gpu`` would use), read from the DEBUG line ``crossdali.common.loading.dali_loader``
  logs on every rank; under ``srun --gpus-per-task=1`` (one ``CUDA_VISIBLE_DEVICES`` id per task) GPU 0;
- the classification training script: rank 0 alone writes (checkpoints, metrics, log lines), every
  sample is counted once, and its reported top-1 equals one process evaluating its checkpoint.

Several real hosts are not available to CI: this loopback form is how multi-node is shown here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from crossdali.common.scripts.metrics import read_metrics

pytest.importorskip("torch")

pytestmark = [pytest.mark.slow, pytest.mark.pytorch]
NODES, PER_NODE = 2, 2
WORLD = NODES * PER_NODE
TRAIN_BATCH = 6  # 264 train samples / 4 ranks = 66 = 11 full batches: the whole train set every epoch
# One epoch of the small CNN at 32 px on the tiny set (264 train, 55 val samples, 11 classes);
# -b 11: 66 train samples per rank, 6 full batches, so every train sample is used once.
TRAIN = ["-m", "crossdali.pytorch.train_classification", "--arch", "small_cnn", "--crop-size", "32", "-b", "11",
         "--epochs", "1", "--lr", "0.2", "--lr-warmup-epochs", "0.5", "-j", "1", "--print-freq", "0"]
# "rank 2 of 4 (local rank 0): DALI shard 2 of 4 on the CPU (dali-gpu would use GPU 0)"
PLACEMENT = re.compile(r"rank (\d+) of (\d+) \(local rank (\d+)\): DALI shard (\d+) of (\d+) on .*GPU (\d+)")
# torchrun's prefix of each worker's output lines: "<global rank>:<local rank>| "
PREFIX = re.compile(r"^(\d+):(\d+)\| (.*)$")
# horovodrun's prefix: "[<rank>]<stdout>:" or "[<rank>]<stderr>:"
HOROVOD_PREFIX = re.compile(r"^\[(\d+)\]<std(?:out|err)>:(.*)$")
HOROVODRUN = Path(sys.executable).parent / "horovodrun"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(data_root: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI_", "HOROVOD_"))}
    return {**env, "CROSSDALI_DATA": str(data_root), "OMP_NUM_THREADS": "1", **extra}


def _wait_all(procs: list[subprocess.Popen], what: str) -> list[str]:
    """Every process's output (stdout and stderr together); all must exit 0."""
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=600)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, f"{what}: a process failed ({p.returncode}):\n{out[-4000:]}"
    return outputs


def _torchrun_two_nodes(args: list[str], *, tmp: Path, data_root: Path) -> dict[int, list[str]]:
    """``torchrun --nnodes 2 --nproc_per_node 2`` started as two node processes on the loopback;
    returns each global rank's output lines (torchrun prefixes them with the rank)."""
    endpoint = f"127.0.0.1:{_free_port()}"
    procs = []
    for node in range(NODES):
        # node 0 hosts the rendezvous store; c10d gives the group ranks in the order the nodes join
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(NODES), "--nproc_per_node",
                   str(PER_NODE), "--node_rank", str(node), "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint,
                   "--rdzv_id", "two-nodes", "--rdzv_conf", f"is_host={int(node == 0)}", "--max_restarts", "0",
                   "--log_dir", str(tmp / f"torchrun-node{node}"), "--tee", "3",
                   "--log_line_prefix_template", "${rank}:${local_rank}| ", *args]
        procs.append(subprocess.Popen(command, env=_env(data_root), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    lines: dict[int, list[str]] = {r: [] for r in range(WORLD)}
    for out in _wait_all(procs, "torchrun --nnodes 2"):
        ranks = set()
        for m in filter(None, map(PREFIX.match, out.splitlines())):
            rank, local = int(m[1]), int(m[2])
            assert local == rank % PER_NODE, f"torchrun gave rank {rank} local rank {local}"
            ranks.add(rank)
            lines[rank].append(m[3])
        assert len({r // PER_NODE for r in ranks}) <= 1, f"one node process ran ranks {sorted(ranks)}"
    return lines


def _slurm_two_nodes(args: list[str], *, data_root: Path, gpus_per_task: bool = False) -> dict[int, list[str]]:
    """The 4 tasks ``srun --nodes 2 --ntasks-per-node 2`` would start, with its variables; returns each
    rank's output lines. ``gpus_per_task``: as with ``--gpus-per-task=1``, each task sees only its own GPU
    (``CUDA_VISIBLE_DEVICES`` = its local rank's id)."""
    port = str(_free_port())
    procs = []
    for rank in range(WORLD):
        node, local = divmod(rank, PER_NODE)
        slurm = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local),
                 "SLURM_NODEID": str(node), "SLURM_NTASKS": str(WORLD), "SLURM_NPROCS": str(WORLD),
                 "SLURM_NNODES": str(NODES), "SLURM_NTASKS_PER_NODE": str(PER_NODE),
                 "SLURM_STEP_NUM_TASKS": str(WORLD), "SLURM_STEP_NUM_NODES": str(NODES),
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        if gpus_per_task:
            slurm |= {"CUDA_VISIBLE_DEVICES": str(local), "SLURM_GPUS_PER_TASK": "1"}
        procs.append(subprocess.Popen([sys.executable, *args], env=_env(data_root, **slurm), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return dict(enumerate(out.splitlines() for out in _wait_all(procs, "Slurm, 2 nodes x 2 tasks")))


def _horovodrun_two_hosts(args: list[str], *, data_root: Path) -> dict[int, list[str]]:
    """``horovodrun --gloo -np 4 -H localhost:2,127.0.0.1:2``: two host entries for this one machine, so
    Horovod numbers the local ranks per host; returns each rank's output lines."""
    if importlib.util.find_spec("horovod") is None or not HOROVODRUN.exists():
        if os.environ.get("CROSSDALI_REQUIRE_HOROVOD") == "1":
            pytest.fail("CROSSDALI_REQUIRE_HOROVOD=1 but Horovod is not installed: run scripts/install-horovod")
        pytest.skip("Horovod is not installed in this environment: scripts/install-horovod (a full nox -s tests-pytorch)")
    command = [str(HOROVODRUN), "--gloo", "-np", str(WORLD), "-H", f"localhost:{PER_NODE},127.0.0.1:{PER_NODE}",
               sys.executable, *args]
    (out,) = _wait_all([subprocess.Popen(command, env=_env(data_root), stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True)], "horovodrun, 2 host entries")
    lines: dict[int, list[str]] = {r: [] for r in range(WORLD)}
    for m in filter(None, map(HOROVOD_PREFIX.match, out.splitlines())):
        lines[int(m[1])].append(m[2])
    return lines


def _placements(lines: dict[int, list[str]]) -> dict[int, set[tuple[int, ...]]]:
    """rank -> the (rank, world, local rank, shard, shards, GPU) of each DALI pipeline it logged."""
    return {rank: {tuple(int(g) for g in m.groups()) for m in map(PLACEMENT.search, out) if m}
            for rank, out in lines.items()}


def _assert_shards_by_global_rank_gpus_by_local_rank(lines: dict[int, list[str]]) -> None:
    for rank, placed in _placements(lines).items():
        local = rank % PER_NODE
        assert placed == {(rank, WORLD, local, rank, WORLD, local)}, (rank, placed)


def _file_lists(tiny_classification: Path, data: Path) -> dict[str, int]:
    """``train.txt`` and ``val.txt`` over the tiny set with each sample's index as its label."""
    from crossdali.common.data.sources import scan_image_folder

    sizes = {}
    data.mkdir()
    for split in ("train", "val"):
        src = scan_image_folder(tiny_classification / "imagefolder" / split)
        (data / f"{split}.txt").write_text("".join(f"{f} {i}\n" for i, f in enumerate(src.files)))
        sizes[split] = src.num_samples
    return sizes


@pytest.fixture(scope="module")
def index_lists(tiny_classification, tmp_path_factory) -> tuple[Path, dict[str, int]]:
    data = tmp_path_factory.mktemp("two-nodes") / "lists"
    return data, _file_lists(tiny_classification, data)


@pytest.mark.parametrize("launcher", ["torchrun", "slurm", "horovodrun"])
def test_four_ranks_on_two_nodes_read_every_sample_once(tmp_path, data_root, index_lists, assert_epoch_coverage,
                                                        launcher):
    data, sizes = index_lists
    assert sizes["train"] % (WORLD * TRAIN_BATCH) == 0 and sizes["val"] % WORLD  # whole train epochs, uneven val
    probe = [str(Path(__file__)), str(data), str(tmp_path)]
    if launcher == "torchrun":
        lines = _torchrun_two_nodes(probe, tmp=tmp_path, data_root=data_root)
    elif launcher == "slurm":
        lines = _slurm_two_nodes(probe, data_root=data_root)
    else:
        lines = _horovodrun_two_hosts(probe, data_root=data_root)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]

    assert [r["dist"] for r in ranks] == [[r, WORLD, r % PER_NODE, launcher] for r in range(WORLD)]
    assert [r["engine"] for r in ranks] == ["horovod" if launcher == "horovodrun" else "ddp"] * WORLD
    for split in ("train", "val"):
        for epoch in range(len(ranks[0][split])):
            assert_epoch_coverage([r[split][epoch] for r in ranks], sizes[split])
    assert ranks[0]["train"][0] != ranks[0]["train"][1]  # the second epoch is another order
    _assert_shards_by_global_rank_gpus_by_local_rank(lines)


def test_slurm_gpus_per_task_every_rank_uses_the_one_gpu_it_sees(tmp_path, data_root, index_lists):
    """``srun --gpus-per-task=1``: GPU <local rank> does not exist in a task that sees one GPU, so every
    rank's pipelines use GPU 0 (here: the GPU ``dali-gpu`` would use), and say why."""
    data, _ = index_lists
    lines = _slurm_two_nodes([str(Path(__file__)), str(data), str(tmp_path), "placement"], data_root=data_root,
                             gpus_per_task=True)
    for rank, placed in _placements(lines).items():
        assert placed == {(rank, WORLD, rank % PER_NODE, rank, WORLD, 0)}, (rank, placed)
        assert any("bound by the launcher" in line for line in lines[rank]), lines[rank][-20:]


def test_torchrun_two_nodes_training_writes_once_and_reports_the_checkpoints_top1(
        tmp_path, data_root, tiny_classification):
    data = str(tiny_classification / "imagefolder")
    out = tmp_path / "two-nodes"
    lines = _torchrun_two_nodes([*TRAIN, "--data", data, "--output-dir", str(out)], tmp=tmp_path, data_root=data_root)

    records = read_metrics(out)  # rank 0 alone writes: one start and one epoch record
    (start,), (epoch,) = ([r for r in records if r["event"] == e] for e in ("start", "epoch"))
    assert start["world_size"] == WORLD and start["engine"] == "ddp"
    assert epoch["val_samples"] == 55 and epoch["train_samples"] == 264  # every sample once across the ranks
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint_best.pth", "checkpoint_last.pth", "curves.png",
                                                     "metrics.jsonl"]
    # log lines: rank 0's INFO lines only (the other ranks log warnings only, and there are none)
    assert any(f"outputs: {out}" in line for line in lines[0])
    for rank in range(1, WORLD):
        assert not [line for line in lines[rank] if re.match(r"\d\d:\d\d:\d\d ", line)], lines[rank][-20:]

    # one process evaluating the checkpoint rank 0 saved: the top-1 the 4-rank job reported (this
    # needs every rank's BatchNorm statistics to be rank 0's at evaluation time)
    single = tmp_path / "single"
    proc = subprocess.run([sys.executable, *TRAIN, "--data", data, "--resume", str(out / "checkpoint_last.pth"),
                           "--test-only", "--output-dir", str(single)], env=_env(data_root), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    start1, test = read_metrics(single)
    assert start1["world_size"] == 1 and test["event"] == "test" and test["val_samples"] == 55
    assert test["val_top1"] == pytest.approx(epoch["val_top1"])
    assert test["val_loss"] == pytest.approx(epoch["val_loss"], rel=1e-4)


def _probe(data: Path, out: Path, placement_only: bool = False) -> None:
    """Run by the tests above on every rank: which samples this rank's DALI loaders yield (labels are
    sample indices), two train epochs and one val epoch, written to ``<out>/rank<R>.json``.
    ``placement_only``: build the val loader (it logs its placement) and read nothing."""
    import logging

    from crossdali.pytorch import create_classification_loader
    from crossdali.pytorch.distributed import init_distributed

    logging.basicConfig(level=logging.DEBUG, format="%(message)s")  # the loaders' placement line
    runtime = init_distributed()
    common = dict(backend="dali-cpu", crop_size=16, workers=1, dist=runtime.dist, data_format="filelist")
    if placement_only:
        create_classification_loader(data, train=False, batch_size=8, **common)
        runtime.barrier()
        runtime.shutdown()
        return
    train = create_classification_loader(data, train=True, batch_size=TRAIN_BATCH, **common)
    val = create_classification_loader(data, train=False, batch_size=8, **common)
    seen = {"train": [[i for _, labels in train for i in labels.tolist()] for _ in range(2)],
            "val": [[i for _, labels in val for i in labels.tolist()]]}
    d = runtime.dist
    (out / f"rank{d.rank}.json").write_text(json.dumps({"dist": [d.rank, d.world_size, d.local_rank, d.launcher],
                                                        "engine": runtime.engine, **seen}))
    runtime.barrier()
    runtime.shutdown()


if __name__ == "__main__":
    _probe(Path(sys.argv[1]), Path(sys.argv[2]), placement_only=sys.argv[3:] == ["placement"])
