"""Data-parallel scaling of the classification script: images/s per GPU on 1 and N GPUs, PyTorch
under torchrun (DDP) and, where Horovod is installed, horovodrun; JAX in one process over N devices.

    python -m benchmarks.multi_gpu                                    # every GPU count in --gpus: results/latest
    python -m benchmarks.multi_gpu --out DIR --gpus 1,2 --launchers torchrun,horovodrun
    python -m benchmarks.multi_gpu --out DIR --gpus 1,2 --command default --framework jax
    python -m benchmarks.multi_gpu --out DIR --gpus 2 --command default --script-args '-j 8'   # one setting's A/B
    python -m benchmarks.multi_gpu --out /tmp/smoke --smoke          # CPU check of the script (CI runs it)

Each run is the real training script (``crossdali.<framework>.train_classification``) with DALI on every
GPU (``--data-backend dali-gpu``, hardware JPEG decoder) on the ``bench`` sample set (8,195 JPEGs, built
first if missing). ``--command tuned`` (the default) sets ResNet-50, AMP, channels-last, batch 256 per
GPU, ``-j`` and the learning rate explicitly; ``--command default`` runs the command a user types,
``--data DIR --data-backend dali-gpu --epochs E --output-dir D`` and nothing else, under the launcher
(JAX: one process, the GPUs chosen by ``CUDA_VISIBLE_DEVICES``), so the script's own defaults (AMP,
memory format, batch 256 per GPU, the learning rate scaled to the global batch, threads per process)
decide the speed; ``--data-backend synthetic`` gives the same launches without decoding (the model's own
scaling). Epoch 1 warms up; the median ``train_img_s`` of the later epochs is the job's rate.
``steady_img_s`` leaves out each epoch's first and last step too (DALI's epoch start, the short last
batch), which weigh twice as much in a 2-GPU epoch of the bench set (16 steps) as in a 1-GPU one: the
rate of the steps in between, from the script's per-step records. Writes ``multi_gpu.json``,
``multi_gpu.png`` and each run's log (``logs/``) into ``--out``. ``--tree DIR`` runs the training
script of another checkout (the tree before a change, for an A/B run on the same machine).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import gpu_name, usage_error

ROOT = Path(__file__).resolve().parents[1]


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, add_help=add_help,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results/latest"), help="folder for JSON and PNG")
    parser.add_argument("--gpus", default="1,2", help="GPU counts to run (each <= visible GPUs)")
    parser.add_argument("--launchers", default="torchrun,horovodrun", help="torchrun and/or horovodrun (PyTorch)")
    parser.add_argument("--framework", choices=("pytorch", "jax"), default="pytorch",
                        help="jax: one process trains over the first N GPUs (its launcher is recorded as 'jax')")
    parser.add_argument("--command", choices=("tuned", "default"), default="tuned",
                        help="default: the plain command a user types (the script's defaults decide the speed)")
    parser.add_argument("--arch", default="resnet50")
    parser.add_argument("-b", "--batch-size", type=int, default=256, help="per GPU")
    parser.add_argument("--epochs", type=int, default=4, help="epoch 1 is warm-up")
    parser.add_argument("--sample-size", default="bench")
    parser.add_argument("--workers", type=int, default=None, help="DALI threads per GPU (default: cores / GPUs)")
    parser.add_argument("--timeout", type=int, default=540, help="seconds per run")
    parser.add_argument("--data-backend", default="dali-gpu", help="dali-cpu runs (and smoke-tests this) without GPUs")
    parser.add_argument("--no-amp", dest="amp", action="store_false", help="float32 instead of AMP")
    parser.add_argument("--tree", type=Path, default=ROOT,
                        help="checkout whose training script runs (default: this one; another for A/B runs)")
    parser.add_argument("--crop-size", type=int, default=None, help="the script's --crop-size (default: its own, 224)")
    parser.add_argument("--script-args", default="", metavar="FLAGS",
                        help="more flags for the training script in every run, recorded in the JSON (one setting's "
                             "A/B beside a run without it), e.g. --script-args '-j 8'")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU check of this script: DALI CPU, SqueezeNet 1.1 (JAX: small_cnn) at 64 px on the tiny "
                             "set, 1 and 2 processes under torchrun (Gloo; JAX: 1 and 2 host devices), 2 epochs")
    return parser


SMOKE = dict(data_backend="dali-cpu", amp=False, arch="squeezenet1_1", sample_size="tiny", batch_size=16, epochs=2,
             gpus="1,2", launchers="torchrun", crop_size=64, workers=1, timeout=300)


def _command(launcher: str, gpus: int, train_args: list[str]) -> list[str]:
    if launcher == "jax":  # one process over every visible device (CUDA_VISIBLE_DEVICES picks them)
        return [sys.executable, "-m", "crossdali.jax.train_classification", *train_args]
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(gpus),
                "-m", "crossdali.pytorch.train_classification", *train_args]
    horovodrun = shutil.which("horovodrun") or str(Path(sys.executable).parent / "horovodrun")
    return [horovodrun, "-np", str(gpus), "-H", f"localhost:{gpus}", sys.executable, "-m",
            "crossdali.pytorch.train_classification", *train_args]


def run_one(launcher: str, gpus: int, args: argparse.Namespace) -> dict:
    workers = args.workers or max(1, (os.cpu_count() or 2) // gpus - 1)
    record: dict = {"launcher": launcher, "gpus": gpus, "command": args.command,
                    **({"script_args": args.script_args} if args.script_args else {})}
    if args.command == "tuned":
        record["workers_per_gpu"] = workers
    if launcher == "horovodrun" and importlib.util.find_spec("horovod") is None:
        return record | {"skipped": "Horovod is not installed here (scripts/install-horovod needs network and a "
                                    "compiler; see docs/distributed.md)"}
    with tempfile.TemporaryDirectory() as tmp:
        if args.command == "default":
            train_args = ["--data", str(args.data), "--data-backend", args.data_backend, "--epochs", str(args.epochs),
                          "--output-dir", tmp]
        else:
            train_args = ["--data-backend", args.data_backend, "--sample-size", args.sample_size, "--arch", args.arch,
                          "-b", str(args.batch_size), "--epochs", str(args.epochs), "--channels-last",
                          "-j", str(workers), "--lr-warmup-epochs", "1", "--print-freq", "0", "--output-dir", tmp,
                          # the same rate in every run (the script scales --lr to the global batch): 0.4 on 4 GPUs
                          # diverged within the bench set's 8-step warm-up epoch, and the script stops on a NaN loss
                          "--lr", f"{0.1 / gpus:g}", *(["--crop-size", str(args.crop_size)] if args.crop_size else []),
                          *(["--amp"] if args.amp else [])]
        train_args += shlex.split(args.script_args)
        tree = args.tree.resolve()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}
        if launcher == "jax" and args.visible_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(gpus)))
        elif launcher == "jax":  # no GPU here: N host devices stand in for N GPUs
            env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={gpus}".strip()
        start = time.perf_counter()
        proc = subprocess.run(_command(launcher, gpus, train_args), capture_output=True, text=True,
                              timeout=args.timeout, env=env, cwd=tree)
        record["wall_s"] = round(time.perf_counter() - start, 1)
        logs = args.out / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        (logs / f"{launcher}_{gpus}gpu.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            return record | {"failed": proc.stderr[-4000:]}
        records = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r["event"] == "epoch"]
    timed = [r["train_img_s"] for r in epochs[1:]] or [epochs[-1]["train_img_s"]]
    job = statistics.median(timed)
    engine = records[0].get("engine", "jax" if launcher == "jax" else None)
    return record | {"engine": engine, "img_s": round(job, 1), "img_s_per_gpu": round(job / gpus, 1),
                     "epoch_img_s": [round(r["train_img_s"], 1) for r in epochs], **steady_rate(records),
                     "val_top1_last": epochs[-1].get("val_top1"), "val_samples_last": epochs[-1].get("val_samples"),
                     **{k: records[0][k] for k in ("batch_size", "workers", "amp", "memory_format", "lr", "lr_rule")
                        if k in records[0]}}


def steady_rate(records: list[dict]) -> dict:
    """Images/s of the steps between each epoch's first and last (epoch 1 left out), with their median
    step and data wait: the per-step rate without the epoch boundaries."""
    steps = [r for r in records if r["event"] == "step"]
    last = {}
    for r in steps:
        last[r["epoch"]] = max(last.get(r["epoch"], 0), r["step"])
    inner = [r for r in steps if r["epoch"] > 1 and 1 < r["step"] < last[r["epoch"]]]
    if not inner:
        return {}
    seconds = sum(r["step_s"] for r in inner)
    return {"steady_img_s": round(sum(r["samples"] for r in inner) / seconds, 1), "steady_steps": len(inner),
            "step_ms_median": round(1000 * statistics.median(r["step_s"] for r in inner), 2),
            "data_wait_ms_median": round(1000 * statistics.median(r["data_wait_s"] for r in inner), 3)}


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in results if "img_s_per_gpu" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = [f"{r['launcher']}\n{r['gpus']} GPU" for r in done]
    bars = ax.bar(labels, [r["img_s_per_gpu"] for r in done], color="#76b900")
    ax.bar_label(bars, fmt="%.0f")
    ax.set_ylabel("images/s per GPU")
    ax.set_title("ResNet-50 training, DALI on each GPU: per-GPU throughput")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _visible_gpus() -> int:
    """GPUs on this machine, counted by ``nvidia-smi`` (no framework imported: JAX would take them)."""
    if not shutil.which("nvidia-smi"):
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    return sum(line.startswith("GPU ") for line in out.splitlines())


def _framework_version(framework: str) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    name = "torch" if framework == "pytorch" else "jax"
    try:
        return {name: version(name)}
    except PackageNotFoundError:
        return {name: None}


def main(args: argparse.Namespace) -> list[dict]:
    if args.smoke:  # JAX's smallest model stands in for SqueezeNet, which it lacks
        args = argparse.Namespace(**{**vars(args), **SMOKE, **({"arch": "small_cnn"} if args.framework == "jax" else {})})
    if not (args.tree / "crossdali" / "pytorch" / "train_classification.py").is_file():
        raise usage_error(f"--tree {args.tree}: no crossdali/pytorch/train_classification.py there; pass a checkout "
                          "of this repository (e.g. git worktree add DIR COMMIT)")

    from crossdali.common.data.sample_data import ensure_classification
    from crossdali.common.data.sources import resolve_source

    visible = args.visible_gpus = _visible_gpus()
    counts = [int(g) for g in args.gpus.split(",")]
    if args.data_backend == "dali-gpu" and visible < max(counts):
        raise usage_error(f"--gpus {args.gpus} needs {max(counts)} GPUs, {visible} visible: pass --gpus 1,{visible or 1}")
    root = ensure_classification(size=args.sample_size, formats=("imagefolder",))  # build once, before any rank starts
    args.data = root / "imagefolder"
    val_images = resolve_source(root / "imagefolder", "val", validate=False).num_samples  # the script's val split
    results = []
    launchers = ["jax"] if args.framework == "jax" else args.launchers.split(",")
    for launcher in launchers:
        for gpus in counts:
            result = run_one(launcher, gpus, args)
            print(json.dumps(result)[:400], flush=True)
            results.append(result)
    for r in results:  # scaling efficiency against the same launcher on one GPU
        one = next((o for o in results if o["launcher"] == r["launcher"] and o["gpus"] == 1 and "img_s" in o), None)
        if one and "img_s" in r:
            r["scaling_efficiency"] = round(r["img_s_per_gpu"] / one["img_s_per_gpu"], 3)
        if one and "steady_img_s" in r and "steady_img_s" in one:
            r["steady_scaling_efficiency"] = round(r["steady_img_s"] / r["gpus"] / one["steady_img_s"], 3)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": gpu_name(), "gpus_visible": visible, "framework": args.framework, "command": args.command,
            "data_backend": args.data_backend, "amp": args.amp if args.command == "tuned" else "script default",
            **_framework_version(args.framework),
            "cpu_count": os.cpu_count(), "python": platform.python_version(), "arch": args.arch,
            "batch_size_per_gpu": args.batch_size, "epochs": args.epochs, "sample_size": args.sample_size,
            # every run's val_samples_last should equal val_images: each sample once over all ranks
            "val_images": val_images, "tree": str(args.tree.resolve()),
            "environment": {k: os.environ[k] for k in ("CUDA_DEVICE_MAX_CONNECTIONS", "NCCL_NVLS_ENABLE", "NCCL_ALGO",
                                                       "NCCL_PROTO", "OMP_NUM_THREADS") if k in os.environ}}
    (args.out / "multi_gpu.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    plot(results, args.out / "multi_gpu.png")
    return results


if __name__ == "__main__":
    main(get_args_parser().parse_args())
