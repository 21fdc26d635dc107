"""The GPU benchmarks' own CPU smoke runs (``--smoke``), so the scripts behind docs/benchmarks.md keep
working on machines without a GPU: each runs its real DALI CPU pipelines and baselines on the tiny
sample set and writes a JSON (and a plot) with a positive rate and no error for every row."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchvision")
pytest.importorskip("matplotlib")

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _run(module: str, out: Path, data_root: Path, *extra: str) -> dict:
    env = {**os.environ, "CROSSDALI_DATA": str(data_root), "OMP_NUM_THREADS": "2"}
    proc = subprocess.run([sys.executable, "-m", module, "--smoke", "--out", str(out), *extra], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    name = module.rsplit(".", 1)[1]
    return json.loads((out / f"{name}.json").read_text())


def test_classification_benchmark_policy_rows_only(tmp_path, data_root):
    """``--only`` keeps the rows asked for: here the DALI CPU row beside its augmentation-policy row, each a
    whole pass over the tiny train split per epoch, the policy recorded in its row."""
    report = _run("benchmarks.classification_loaders", tmp_path, data_root, "--skip-train",
                  "--auto-augment", "trivialaugment", "--only", "DALI CPU")
    loader = {r["name"]: r for r in report["loader"]}  # --smoke adds the 2-pipeline row
    assert set(loader) == {"DALI CPU", "DALI CPU, 2 pipelines", "DALI CPU, trivialaugment"}, set(loader)
    assert loader["DALI CPU"]["auto_augment"] == "none" and loader["DALI CPU, trivialaugment"]["auto_augment"] == "trivialaugment"
    for row in loader.values():
        assert "error" not in row and row["epochs"] >= 2 and row["images"] == 264 * row["epochs"], row


def test_classification_benchmark_smoke(tmp_path, data_root):
    import torch

    from benchmarks.classification_loaders import SPDL_ROWS

    report = _run("benchmarks.classification_loaders", tmp_path, data_root)
    loader = {r["name"]: r for r in report["loader"]}
    assert set(loader) == {"torchvision PIL ImageFolder", "torchvision decode_image + v2 (native)",
                           "torchvision decode_jpeg on the CPU + v2", "DALI CPU", "DALI CPU, 2 pipelines", *SPDL_ROWS}
    assert loader["DALI CPU, 2 pipelines"]["pipelines"] == 2 and loader["DALI CPU"]["pipelines"] == 1
    # SPDL is optional: where it does not import, its rows say why instead of timing anything
    skipped = {name for name, row in loader.items() if "skipped" in row}
    assert skipped <= set(SPDL_ROWS), skipped
    if not torch.cuda.is_available():  # nvJPEG decodes on the GPU: never timed on a CPU
        assert "SPDL nvJPEG (GPU decode) + v2" in skipped, loader
    for name, row in loader.items():
        assert "error" not in row, row
        if name in skipped:
            continue
        # every timed epoch is a whole pass over the tiny train split (264 images)
        assert row["epochs"] >= 2 and row["images"] == 264 * row["epochs"] and row["img_s"] > 0, row
        assert row["engine_load"] is None or "samples" in row["engine_load"], row  # None without nvidia-smi
    train = report["train"]
    assert [r["backend"] for r in train] == ["synthetic", "dali-cpu", "native"]
    assert all("error" not in r and r["img_s"] > 0 and 0 <= r["data_wait_share"] < 1 for r in train), train
    assert all(r["engine_load"] is None or "samples" in r["engine_load"] for r in train), train
    assert report["speedup_vs_native"]["torchvision decode_image + v2 (native)"] == pytest.approx(1.0)

    proc = subprocess.run([sys.executable, "-m", "benchmarks.plot", str(tmp_path / "classification_loaders.json")],
                          env={**os.environ}, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "classification_loaders.png").stat().st_size > 10_000


def test_classification_training_rounds_give_the_ratio_to_synthetic(tmp_path, data_root):
    """Training rows only, in two interleaved rounds: each round's row is kept, and the ratio to the
    synthetic row of the same round is summarised; the plot has the training panel alone."""
    report = _run("benchmarks.classification_loaders", tmp_path, data_root, "--skip-loader", "--train-rounds", "2",
                  "--train-backends", "synthetic,dali-cpu")
    assert report["loader"] == []
    assert [r["name"] for r in report["train"]] == ["synthetic (round 1)", "DALI CPU (round 1)",
                                                    "synthetic (round 2)", "DALI CPU (round 2)"]
    ratio = report["train_vs_synthetic"]["DALI CPU"]
    rows = {r["name"]: r["img_s"] for r in report["train"]}
    assert ratio["rounds"] == 2 and ratio["min"] <= ratio["mean"] <= ratio["max"]
    assert ratio["min"] == pytest.approx(min(rows[f"DALI CPU (round {k})"] / rows[f"synthetic (round {k})"]
                                             for k in (1, 2)))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.plot", str(tmp_path / "classification_loaders.json")],
                          env={**os.environ}, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_classification_training_loops_record_their_loss(tmp_path, data_root):
    """The benchmark's training loops (plain SGD, fused SGD, loss copied at its step and read two steps late) run and record a
    finite final loss per row (a NaN row is marked invalid and left out of the ratios); a bad loop name
    is one line and exit 2."""
    report = _run("benchmarks.classification_loaders", tmp_path, data_root, "--skip-loader",
                  "--train-backends", "synthetic", "--train-loop", "scaler,fused,copied2", "--cuda-queues", "unset")
    rows = report["train"]
    assert [r["loop"] for r in rows] == ["scaler", "fused", "copied2"]
    assert all("error" not in r and r["final_loss"] == r["final_loss"] and r["final_loss"] > 0 for r in rows), rows
    proc = subprocess.run([sys.executable, "-m", "benchmarks.classification_loaders", "--smoke", "--out", str(tmp_path),
                           "--skip-loader", "--train-loop", "fast"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "--train-loop 'fast'" in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "benchmarks.classification_loaders", "--smoke", "--out", str(tmp_path),
                           "--pipeline-hw-loads", "0.9,2"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "--pipeline-hw-loads '0.9,2'" in proc.stderr and "Traceback" not in proc.stderr


def test_detection_benchmark_smoke(tmp_path, data_root):
    report = _run("benchmarks.detection_loaders", tmp_path, data_root)
    rows = {r["backend"]: r for r in report["loader"]}
    assert set(rows) == {"dali-cpu", "native"}
    for row in rows.values():
        assert "error" not in row and row["img_s"] > 0 and row["images"] >= 3 * report["batch_size"], row
        assert row["positive_anchors_per_image"] > 1, row  # the box encoder matched real objects
        assert row["pipelines"] == 1, row
    assert rows["dali-cpu"]["canvas_free"] is True and rows["native"]["canvas_free"] is None
    assert rows["dali-cpu"]["fused_colour"] is False and rows["native"]["fused_colour"] is None
    if shutil.which("nvidia-smi") is None:  # no dmon: no engine load, no log
        assert all("engine_load" not in row for row in rows.values()) and "engine_load" not in report
        assert not (tmp_path / "detection_loaders_dmon.log").exists()
    assert (tmp_path / "detection_loaders.png").stat().st_size > 10_000


def test_detection_benchmark_fused_colour_rows():
    """``--fused-colour`` adds a DALI GPU row per ``--pipelines`` count with the plugin's colour operator, after
    the three-way comparison's row; without it no row fuses."""
    from benchmarks.detection_loaders import _gpu_configs, _row, get_args_parser

    def rows(*argv):
        args = get_args_parser().parse_args(["--hw-loads", "1.0", *argv])
        return [_row(name, cfg, args.batch_size) for name, cfg in _gpu_configs(args)]

    plain = rows("--pipelines", "1,2", "--no-gpu-canvas")
    assert [(r["name"], r["pipelines"]) for r in plain] == [("DALI GPU hw_decoder_load=1", 2),  # the loader's default
                                                            ("DALI GPU hw_decoder_load=1, 1 pipeline", 1)]
    assert not any(r["fused_colour"] for r in plain), plain
    fused = rows("--pipelines", "1,2", "--fused-colour", "--no-gpu-canvas")
    assert fused[:len(plain)] == plain
    assert [(r["name"], r["pipelines"], r["fused_colour"], r["canvas_free"]) for r in fused[len(plain):]] == [
        ("DALI GPU hw_decoder_load=1, fused colour", 2, True, True),
        ("DALI GPU hw_decoder_load=1, fused colour, 1 pipeline", 1, True, True)]
    assert [r["pipelines"] for r in rows("--pipelines", "1", "--fused-colour") if r["fused_colour"]] == [2, 1]
    canvas = [r for r in rows("--pipelines", "4") if not r["canvas_free"]]
    assert [(r["name"], r["pipelines"]) for r in canvas] == [
        ("DALI GPU hw_decoder_load=1, with the canvas", 2), ("DALI GPU hw_decoder_load=1, with the canvas, 4 pipelines", 4)]
    assert all(r["canvas_free"] for r in plain), plain  # the default builds no canvas


def test_video_benchmark_smoke(tmp_path, data_root):
    report = _run("benchmarks.video_decode", tmp_path, data_root, "--work", str(tmp_path / "videos"))
    kinds = {r["kind"] for r in report["results"]}
    assert {"dali-cpu", "cpu"} <= kinds, kinds
    assert all("error" not in r and r["fps"] > 0 for r in report["results"]), report["results"]
    assert report["target_met"] is None  # the smoke run decodes no 1080p, so it claims nothing
    loader = {(r["pipelines"], r["shuffled"], r["clips_per_read"]): r
              for r in report["results"] if r["name"].startswith("crossdali loader")}
    # train (shuffled) with 1 and 2 pipelines and with 2 clips per read, val (in order) with 1; whole clips
    assert sorted(loader) == [(1, False, 1), (1, True, 1), (1, True, 2), (2, True, 1)]
    assert all(r["frames"] % 16 == 0 for r in loader.values())
    shuffled = [r for r in report["results"] if r["name"].endswith("shuffled clips")]
    assert len(shuffled) == 1 and shuffled[0]["shuffled"] and shuffled[0]["fps"] > 0
    dali = [r for r in report["results"] if r["kind"] == "dali-cpu"]
    # DALI's rows say how many CPU cores they kept busy (the 2 cores here: more than 0, at most 2 and change)
    assert all(0 < r["cpu_cores_busy"] <= (os.cpu_count() or 1) + 0.5 for r in dali), dali
    if shutil.which("nvidia-smi") is None:  # no engines to sample: the load says so instead of inventing one
        assert all(r.get("engine_load") is None for r in report["results"]), report["results"]
    assert (tmp_path / "video_decode.png").stat().st_size > 10_000


def test_training_speed_runs_the_default_command_beside_the_tuned_one(tmp_path, data_root):
    """``benchmarks/training_speed.py --framework pytorch`` with its default ``--modes default,tuned``: the default
    command's rows run ``crossdali train classification`` with only the data, the backend and the run length (no
    speed flags), the tuned rows the script with its flags; a ``dali-cpu:2`` row runs the script with
    ``--pipelines 2`` (its start record says so); each row's share is of the synthetic row of its own mode, and
    every row records its peak memory. A malformed ``:N`` or mode is one line and exit 2."""
    env = {**os.environ, "CROSSDALI_DATA": str(data_root), "OMP_NUM_THREADS": "2"}
    cmd = [sys.executable, "-m", "benchmarks.training_speed", "--smoke", "--framework", "pytorch", "--out",
           str(tmp_path)]
    # about 70 s per two rows on an idle 2-core CPU machine
    proc = subprocess.run([*cmd, "--backends", "synthetic,dali-cpu:2"], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "training_speed_pytorch.json").read_text())
    rows = {r["label"]: r for r in report["rows"]}
    assert list(rows) == ["synthetic (default command)", "dali-cpu:2 (default command)", "synthetic (tuned)",
                          "dali-cpu:2 (tuned)"], list(rows)
    for row in rows.values():
        log = tmp_path / f"training_speed_pytorch_{row['run']}.log"  # a failed row's log, kept beside the JSON
        assert "error" not in row, (row["label"], row["error"], log.read_text()[-3000:] if log.exists() else "")
        assert row["images"] == 264 and row["img_s"] > 0, row
        assert row["pipelines"] == (2 if row["backend"] == "dali-cpu" else 1), row
        assert row["cuda_graphs"] is False, row  # the script's start record, copied into the row: eager on the CPU
        assert row["peak_host_rss_mib"] > 100, row  # a Python process with torch and DALI loaded
        if shutil.which("nvidia-smi") is None:
            assert row["peak_gpu_memory_mib"] is None, row
        words = row["command"].split()
        assert ("--pipelines" in words) == (row["backend"] == "dali-cpu"), words
        if row["mode"] == "default command":
            assert words[:6] == ["-m", "crossdali", "train", "classification", "--framework", "pytorch"], words
            # --smoke adds the small model, crop and batch; nothing else beyond data, backend and run length
            assert set(words[6::2]) <= {"--data", "--data-backend", "--epochs", "--output-dir", "--arch", "--crop-size",
                                        "-b", "--pipelines"}, words
        else:
            assert words[1] == "crossdali.pytorch.train_classification" and "-j" in words, words
        assert Path(words[words.index("--data") + 1]) == data_root / "tiny" / "classification" / "imagefolder"
    shares = report["share_of_synthetic"]
    assert shares["synthetic (default command)"] == shares["synthetic (tuned)"] == 1.0
    for mode in ("default command", "tuned"):
        assert shares[f"dali-cpu:2 ({mode})"] == pytest.approx(
            rows[f"dali-cpu:2 ({mode})"]["img_s"] / rows[f"synthetic ({mode})"]["img_s"])
    assert set(report["modes"]) == {"default command", "tuned"}
    assert (tmp_path / "training_speed_pytorch.png").exists()
    for bad, words in [("--backends=synthetic:2", "dali-gpu / dali-cpu rows only"),
                       ("--backends=dali-cpu:0", "positive integer"), ("--modes=fast", "choose among default, tuned")]:
        proc = subprocess.run([*cmd, bad], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr
        assert words in proc.stderr and bad.split("=")[1] in proc.stderr, proc.stderr


def test_training_speed_shares_of_interleaved_rounds():
    """``--rounds N``: each row over the synthetic row of its own round and mode, then mean, min and max."""
    from benchmarks.training_speed import _round_shares

    def row(backend, round_, img_s, mode="tuned"):
        return {"backend": backend, "label": f"{backend} ({mode})", "round": round_, "mode": mode, "img_s": img_s}

    rows = [row("synthetic", 1, 100.0), row("dali-gpu", 1, 90.0), row("synthetic", 1, 50.0, "default command"),
            row("dali-gpu", 1, 45.0, "default command"), row("synthetic", 2, 200.0), row("dali-gpu", 2, 190.0),
            row("dali-gpu", 3, 10.0)]  # no synthetic row in round 3: left out, not divided by another round's
    shares = _round_shares(rows)
    assert shares["dali-gpu (tuned)"] == {"mean": pytest.approx(0.925), "min": 0.9, "max": 0.95, "rounds": 2}
    assert shares["dali-gpu (default command)"] == {"mean": 0.9, "min": 0.9, "max": 0.9, "rounds": 1}


def test_check_speed_fast_only_times_the_crossdali_on_its_path(tmp_path, data_root):
    # the A/B use: run outside the repository with a tree on PYTHONPATH; the JSON names the crossdali that ran
    env = {**os.environ, "CROSSDALI_DATA": str(data_root), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.check_speed", "--smoke", "--fast-only", "--copies", "2",
                           "--out", str(tmp_path)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "fast_pass.json").read_text())
    assert Path(report["crossdali"]) == ROOT / "crossdali"
    images = [p for p in Path(report["data"]).rglob("*") if p.is_file()]
    assert report["files"] == 2 * len(images) > 0  # every file, twice (--copies 2)
    assert list(report["files_per_s"]) == ["check fast"] and report["files_per_s"]["check fast"] > 0
    assert not (tmp_path / "check_speed.json").exists()  # the full pass and the loader were not timed


def test_check_speed_smoke_times_both_passes_beside_the_loader(tmp_path, data_root):
    report = _run("benchmarks.check_speed", tmp_path, data_root)
    assert set(report["files_per_s"]) == {"check fast", "check full", "full pass decoder alone", "loader decode",
                                          "loader epoch incl. build"}
    assert all(v > 0 for v in report["files_per_s"].values()) and report["files"] > 0
    assert report["full_pass_vs_loader"] > 0 and (tmp_path / "check_speed.png").stat().st_size > 5_000


def test_multi_gpu_benchmark_smoke(tmp_path, data_root):
    """benchmarks/multi_gpu.py on the CPU: the real training script under torchrun in 1 and 2 processes
    (Gloo), each run's rate, its inner-step rate from the script's step records, its log, and every val
    sample seen once over the ranks."""
    report = _run("benchmarks.multi_gpu", tmp_path, data_root)
    one, two = report["results"]
    assert (one["gpus"], one["engine"], two["gpus"], two["engine"]) == (1, "none", 2, "ddp")
    for r in (one, two):
        assert "failed" not in r, r.get("failed")
        assert r["img_s"] > 0 and r["steady_img_s"] > 0 and r["step_ms_median"] > 0
        assert r["val_samples_last"] == report["meta"]["val_images"]  # each val sample once over all ranks
        assert (tmp_path / "logs" / f"torchrun_{r['gpus']}gpu.log").read_text().strip()
    assert one["steady_steps"] > two["steady_steps"] > 0  # half the steps per rank on 2 processes
    assert two["scaling_efficiency"] > 0 and two["steady_scaling_efficiency"] > 0
    assert (tmp_path / "multi_gpu.png").stat().st_size > 0


def test_multi_gpu_benchmark_names_a_tree_that_is_not_a_checkout(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.multi_gpu", "--tree", str(tmp_path), "--out",
                           str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"--tree {tmp_path}: no crossdali/pytorch/train_classification.py there; pass a checkout of this repository "
        "(e.g. git worktree add DIR COMMIT)"]
