"""Training images/s of a framework's real classification script, fed by each data backend, in one run
(docs/benchmarks.md#training-speed).

    python -m benchmarks.training_speed --framework pytorch        # GPU: default command and tuned, synthetic/dali-gpu/native
    python -m benchmarks.training_speed --framework tensorflow     # the same rows for Keras (jax: JAX)
    python -m benchmarks.training_speed --smoke --framework tensorflow --out /tmp/bench   # CPU check of the script
    python -m benchmarks.training_speed --framework tensorflow --modes tuned --variant xla='--jit-compile on' \
        --variant graph='--jit-compile off'     # every backend with and without XLA, one run

Each row runs the framework's classification script in its own process on the ``bench`` sample set,
with one ``--data-backend`` (``synthetic`` is the model's own ceiling: no decoding at all), in one of two
modes (``--modes``):

* ``default command``: exactly what a user types, ``crossdali train classification --framework F --data DIR
  --data-backend B`` plus ``--epochs`` and ``--output-dir`` (nothing else that affects speed), so the row
  shows what the script's own defaults reach;
* ``tuned``: ResNet-50 with the flags set explicitly (``--amp``, ``-b 256``, ``-j`` cores - 1, and
  ``--channels-last`` for PyTorch).

Epoch 1 is the warm-up (graph tracing, autotuning, the first DALI pipeline); the later epochs' ``step``
records of the run's ``metrics.jsonl`` give the row: images/s over those steps and the share of step time
spent waiting for the next batch; ``steady`` gives the images/s without each epoch's first five steps and
its last (the bench set's epochs are short, so an epoch's restart after the val pass weighs far more in a
row than in a long epoch); ``gpu_wait_ms`` (the PyTorch script on a GPU) gives the host's lead over the GPU
per step, near 0 where the GPU waited for the host. Each row also records the memory it needed:
``peak_gpu_memory_mib`` (GPU 0's used memory sampled by ``nvidia-smi`` every 0.2 s; ``None`` without it)
and ``peak_host_rss_mib`` (the largest resident set of the script's process or a worker it waited for).
Rows run one after another in one call, so their ratios hold on the same machine.
Writes ``training_speed_<framework>.json`` after every row (default folder ``results/latest``), then a
PNG beside it (where matplotlib is installed; else ``--plot JSON`` draws it later).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import bench_set, gpu_name, round_spread, usage_error
from benchmarks.plot import backend_color, bar_png

ROOT = Path(__file__).resolve().parents[1]
FILL_STEPS = 5  #: an epoch's first step records left out of its steady-state rate (``steady_steps``)
SCRIPTS = {"tensorflow": "crossdali.tensorflow.train_classification",
           "pytorch": "crossdali.pytorch.train_classification",
           "jax": "crossdali.jax.train_classification"}
#: ``--modes`` -> the label its rows carry
MODES = {"default": "default command", "tuned": "tuned"}


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, add_help=add_help,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--framework", choices=list(SCRIPTS), default="tensorflow")
    parser.add_argument("--out", type=Path, default=Path("results/latest"), help="folder for the JSON and PNG")
    parser.add_argument("--backends", default=None,
                        help="comma-separated, in run order (default: synthetic,dali-gpu,native; JAX has no native "
                             "backend); 'dali-gpu:2' (PyTorch) runs the script with --pipelines 2")
    parser.add_argument("--modes", default="default,tuned",
                        help="comma-separated: 'default' (the plain command a user types) and/or 'tuned' (the flags "
                             "below set explicitly); each mode runs every backend")
    parser.add_argument("--arch", default="resnet50", help="tuned rows")
    parser.add_argument("-b", "--batch-size", type=int, default=256, help="tuned rows")
    parser.add_argument("--crop-size", type=int, default=224, help="tuned rows")
    parser.add_argument("--epochs", type=int, default=3, help="epoch 1 is the warm-up; the others are timed")
    parser.add_argument("--sample-size", default="bench")
    parser.add_argument("--workers", type=int, default=None,
                        help="DALI threads / loader workers of the tuned rows (default: cores - 1)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per row")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the rows this many times, interleaved (synthetic, dali-gpu, ..., then again): each "
                             "backend's share of synthetic per round, with the spread, in share_of_synthetic_rounds")
    parser.add_argument("--variant", action="append", default=None, metavar="NAME=FLAGS",
                        help="run every backend once more per variant, with these extra flags for the script, labelled "
                             "NAME (repeatable; 'NAME=' adds none), e.g. --variant xla='--jit-compile on' --variant "
                             "graph='--jit-compile off': each row's share is of the synthetic row of its own variant")
    parser.add_argument("--no-amp", dest="amp", action="store_false", help="tuned rows: float32 instead of mixed precision")
    parser.add_argument("--smoke", action="store_true",
                        help="check the script on a CPU-only machine: tiny set, small model, crop 64, float32, dali-cpu "
                             "(the default command's rows get the small model, crop and batch too)")
    parser.add_argument("--plot", type=Path, default=None, metavar="JSON", help="only draw the PNG of a written JSON")
    return parser


def steady_state(metrics: Path, *, warmup_epochs: int = 1) -> dict:
    """Images/s and data-wait share over the ``step`` records after the warm-up epochs."""
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    start = next((r for r in records if r.get("event") == "start"), {})
    steps = [r for r in records if r.get("event") == "step" and r["epoch"] > warmup_epochs]
    if not steps:
        raise RuntimeError(f"{metrics}: no step records after epoch {warmup_epochs}")
    calm = steady_steps(steps)
    seconds = sum(r["step_s"] for r in steps)
    wait = sum(r["data_wait_s"] for r in steps)
    times = sorted(r["step_s"] for r in steps)
    waits = sorted(1000 * r["data_wait_s"] for r in steps)
    return {"steps": len(steps), "images": sum(r["samples"] for r in steps), "seconds": seconds,
            # what the script ran with, from its start record (PyTorch's: CUDA queues, fused optimizer)
            **{k: start[k] for k in ("cuda_queues", "fused_optimizer", "pipelines", "cuda_graphs", "jit_compile",
                                     "read_loss_every", "handover")
               if k in start},
            "img_s": sum(r["samples"] for r in steps) / seconds, "data_wait_share": wait / seconds,
            "median_step_ms": 1000 * times[len(times) // 2], "mean_data_wait_ms": 1000 * wait / len(steps),
            # the wait of every timed step, as the script's metrics.jsonl recorded it
            "data_wait_ms": {"median": waits[len(waits) // 2], "p90": waits[int(0.9 * (len(waits) - 1))],
                             "max": waits[-1]},
            "data_wait_ms_per_step": [round(1000 * r["data_wait_s"], 3) for r in steps],
            # and every timed step's time: an epoch's first and last steps beside the others
            "step_ms_per_step": [round(1000 * r["step_s"], 3) for r in steps],
            **_gpu_wait(steps),
            **({"steady": {"steps": len(calm), "img_s": sum(r["samples"] for r in calm) / sum(r["step_s"] for r in calm),
                              "median_step_ms": 1000 * sorted(r["step_s"] for r in calm)[len(calm) // 2]}} if calm else {})}


def _gpu_wait(steps: list[dict]) -> dict:
    """The PyTorch script's ``gpu_wait_s`` on a GPU (``StepTracker``): the host's lead over the GPU per step.
    Near 0 on most steps: the GPU waited for the host (its data loader or Python), not for its own work."""
    waits = [1000 * r["gpu_wait_s"] for r in steps if "gpu_wait_s" in r]
    if not waits:
        return {}
    ordered = sorted(waits)
    return {"gpu_wait_ms": {"median": ordered[len(ordered) // 2], "p10": ordered[int(0.1 * (len(ordered) - 1))],
                            "min": ordered[0]},
            "gpu_wait_ms_per_step": [round(w, 3) for w in waits]}


def steady_steps(steps: list[dict]) -> list[dict]:
    """The step records without each epoch's first ``FILL_STEPS`` and its last: the rate of a long epoch.
    A step's time runs from one ``step_done`` to the next, and the host runs a step or two ahead of the GPU,
    so after the val pass the first records are the GPU filling up (shorter steps than in steady state), and
    the last one is the drain. The bench set's epochs are a few dozen steps, so these weigh far more in a
    row's images/s than in ImageNet's thousands of steps per epoch."""
    by_epoch: dict[int, list[dict]] = {}
    for r in steps:
        by_epoch.setdefault(r["epoch"], []).append(r)
    return [r for epoch in by_epoch.values() for r in sorted(epoch, key=lambda r: r["step"])[FILL_STEPS:-1]]


def parse_backends(text: str, framework: str) -> list[tuple[str, int | None]]:
    """``--backends``: ``(backend, pipelines)`` per entry, ``pipelines`` None where the entry gives none."""
    rows = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        backend, sep, count = entry.partition(":")
        if not sep:
            rows.append((backend, None))
            continue
        if framework != "pytorch" or not backend.startswith("dali-"):
            raise usage_error(f"--backends {entry!r}: ':N' pipelines apply to the PyTorch script's dali-gpu / dali-cpu "
                              f"rows only (--framework pytorch)")
        if not count.isdigit() or int(count) < 1:
            raise usage_error(f"--backends {entry!r}: give the pipelines as a positive integer, e.g. {backend}:2")
        rows.append((backend, int(count)))
    if not rows:
        raise usage_error(f"--backends {text!r}: give at least one backend, e.g. synthetic,dali-gpu")
    return rows


def parse_modes(text: str) -> list[str]:
    """``--modes``: the modes in run order."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise usage_error(f"--modes {text!r}: choose among {', '.join(MODES)} (comma-separated), e.g. default,tuned")
    return modes


def parse_variants(entries: list[str] | None) -> list[tuple[str | None, list[str]]]:
    """``--variant NAME=FLAGS``: ``(name, flags)`` per entry; one unnamed variant without flags if none given."""
    if not entries:
        return [(None, [])]
    variants = []
    for entry in entries:
        name, sep, flags = entry.partition("=")
        if not sep or not name.strip() or not name.replace("-", "").replace("_", "").isalnum():
            raise usage_error(f"--variant {entry!r}: give NAME=FLAGS, e.g. --variant xla='--jit-compile on' (NAME: "
                              "letters, digits, - and _)")
        variants.append((name.strip(), shlex.split(flags)))
    names = [n for n, _ in variants]
    if len(set(names)) != len(names):
        raise usage_error(f"--variant: each NAME once (got {', '.join(names)})")
    return variants


def row_command(backend: str, args: argparse.Namespace, run_dir: Path, *, mode: str = "tuned",
                pipelines: int | None = None, flags: list[str] | None = None) -> list[str]:
    """The script's command line for one row (after the Python executable)."""
    if mode == "default":  # what a user types: nothing that affects speed besides the data and the backend
        cmd = ["-m", "crossdali", "train", "classification", "--framework", args.framework, "--data", str(args.data),
               "--data-backend", backend, "--epochs", str(args.epochs), "--output-dir", str(run_dir)]
        if args.smoke:  # a CPU-only check of the plumbing: the tuned rows' small model, crop and batch
            cmd += ["--arch", args.arch, "--crop-size", str(args.crop_size), "-b", str(args.batch_size)]
    else:
        cmd = ["-m", SCRIPTS[args.framework], "--data", str(args.data), "--arch", args.arch,
               "-b", str(args.batch_size), "--crop-size", str(args.crop_size), "--epochs", str(args.epochs),
               "--data-backend", backend, "-j", str(args.workers), "--output-dir", str(run_dir), "--print-freq", "0",
               "--skip-check", *(["--amp"] if args.amp else [])]
        if args.framework == "pytorch" and args.amp:
            cmd.append("--channels-last")
    return [*cmd, *(["--pipelines", str(pipelines)] if pipelines else []), *(flags or [])]


class GpuMemoryPeak:
    """GPU 0's used memory, sampled by ``nvidia-smi`` every 0.2 s while the block runs; ``peak_mib`` is the
    largest sample (``None`` where ``nvidia-smi`` is missing). It counts every process on the GPU, as a user's
    ``nvidia-smi`` would, so it includes what a framework reserves beyond what it allocates."""

    def __init__(self) -> None:
        self.peak_mib: int | None = None
        self._proc: subprocess.Popen | None = None
        self._file = None

    def __enter__(self) -> GpuMemoryPeak:
        if shutil.which("nvidia-smi"):
            self._file = tempfile.TemporaryFile(mode="w+")
            self._proc = subprocess.Popen(["nvidia-smi", "-i", "0", "--query-gpu=memory.used",
                                           "--format=csv,noheader,nounits", "-lms", "200"],
                                          stdout=self._file, stderr=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        self._proc.wait()
        self._file.seek(0)
        samples = [int(x) for x in self._file.read().split() if x.isdigit()]
        self._file.close()
        self.peak_mib = max(samples) if samples else None


def run_process(cmd: list[str], log: Path, *, timeout: float, env: dict) -> tuple[int | None, int]:
    """Run ``cmd`` with its output in ``log``: its exit code (``None`` if it ran past ``timeout`` and was
    killed) and its peak resident set in MiB (``os.wait4``: the process's own, or the largest of the
    worker processes it waited for)."""
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
                return proc.returncode, usage.ru_maxrss // 1024
            if time.monotonic() > deadline:
                proc.kill()
                _, _, usage = os.wait4(proc.pid, 0)
                proc.returncode = -9
                return None, usage.ru_maxrss // 1024
            time.sleep(0.2)


def run_row(backend: str, args: argparse.Namespace, work: Path, *, round_: int | None = None,
            pipelines: int | None = None, variant: str | None = None, flags: list[str] | None = None,
            mode: str = "tuned", label_mode: bool = False) -> dict:
    label = backend if pipelines is None else f"{backend}:{pipelines}"
    if label_mode:
        label += f" ({MODES[mode]})"
    if variant is not None:
        label += f" [{variant}]"
    name = label.replace(":", "-x").replace(" (", "-").replace(")", "").replace(" [", "-").rstrip("]").replace(" ", "-")
    run_dir = work / (name if round_ is None else f"{name}-round{round_}")
    cmd = [sys.executable, *row_command(backend, args, run_dir, mode=mode, pipelines=pipelines, flags=flags)]
    row = {"backend": backend, "label": label, "mode": MODES[mode], **({"round": round_} if round_ is not None else {}),
           **({"variant": variant} if variant is not None else {}),
           "run": run_dir.name, "command": " ".join(cmd[1:])}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    log = work / f"{run_dir.name}.log"
    start = time.perf_counter()
    with GpuMemoryPeak() as gpu_memory:
        returncode, rss_mib = run_process(cmd, log, timeout=args.timeout, env=env)
    row |= {"peak_gpu_memory_mib": gpu_memory.peak_mib, "peak_host_rss_mib": rss_mib}
    if returncode is None:
        return row | {"error": f"timed out after {args.timeout} s"}
    row["wall_s"] = time.perf_counter() - start
    if returncode != 0:
        return row | {"error": f"exit {returncode}: {log.read_text().strip().splitlines()[-1:]}"}
    return row | steady_state(run_dir / "metrics.jsonl")


def _img_s(row: dict, *, steady: bool = False) -> float | None:
    """A row's images/s: over all its timed steps, or (``steady``) in steady state (``steady_steps``)."""
    return row.get("steady", {}).get("img_s") if steady else row.get("img_s")


def _group(row: dict) -> tuple:
    """Rows compared with the same synthetic row: the same variant and mode."""
    return row.get("variant"), row.get("mode")


def _round_shares(rows: list[dict], *, steady: bool = False) -> dict:
    """Each row's images/s over synthetic's of the same round, variant and mode: mean, min, max over the rounds."""
    synthetic = {(r["round"], *_group(r)): _img_s(r, steady=steady) for r in rows
                 if r["backend"] == "synthetic" and _img_s(r, steady=steady)}
    shares: dict[str, list[float]] = {}
    for r in rows:
        key = (r["round"], *_group(r))
        if r["backend"] != "synthetic" and _img_s(r, steady=steady) and key in synthetic:
            shares.setdefault(_label(r), []).append(_img_s(r, steady=steady) / synthetic[key])
    return {b: round_spread(v) for b, v in shares.items()}


def _label(row: dict) -> str:
    return row.get("label", row["backend"])  # JSONs written before ':N' rows have no label


def plot(report: dict, png: Path) -> Path | None:
    rows = [r for r in report["rows"] if "img_s" in r]
    return bar_png(
        png, [_label(r) + (f" (round {r['round']})" if "round" in r else "") for r in rows],
        [r["img_s"] for r in rows], headroom=1.5,
        colors=[backend_color(r["backend"]) for r in rows],
        labels=[f"{r['img_s']:,.0f} img/s, data wait {100 * r['data_wait_share']:.0f} %" for r in rows],
        xlabel="training images/s after the warm-up epoch (higher is better)",
        title=f"{report['framework']} classification training; tuned rows: {report['arch']} "
              f"{'AMP' if report['amp'] else 'float32'}, batch {report['batch_size']}; {report['device']}")


def _device() -> str:
    """The GPU's name (nvidia-smi, so this process imports no framework), else the CPU."""
    return gpu_name() or platform.processor() or "cpu"


def main(args: argparse.Namespace) -> dict:
    if args.plot is not None:
        report = json.loads(args.plot.read_text())
        print(f"wrote {plot(report, args.plot.with_suffix('.png'))}")
        return report
    if args.backends is None:
        args.backends = "synthetic,dali-gpu" if args.framework == "jax" else "synthetic,dali-gpu,native"
    if args.smoke:
        # no CPU autocast: bfloat16 is emulated (slow) on CPUs without AVX-512/AMX
        args.sample_size, args.crop_size, args.batch_size, args.epochs, args.amp = "tiny", 64, 32, 2, False
        args.arch = {"tensorflow": "small_cnn", "pytorch": "resnet18", "jax": "resnet18"}[args.framework]
        args.backends = args.backends.replace("dali-gpu", "dali-cpu")
    args.workers = args.workers or max(1, (os.cpu_count() or 2) - 1)
    backends = parse_backends(args.backends, args.framework)
    variants = parse_variants(args.variant)
    modes = parse_modes(args.modes)
    args.data = bench_set(args.sample_size)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"training_speed_{args.framework}.json"
    report = {"benchmark": "training_speed", "command": shlex.join(["python", "-m", "benchmarks.training_speed",
                                                                      *sys.argv[1:]]),
              "framework": args.framework, "device": _device(), "cpu_count": os.cpu_count(),
              "python": platform.python_version(), "arch": args.arch, "amp": args.amp, "batch_size": args.batch_size,
              "crop_size": args.crop_size, "sample_size": args.sample_size, "workers": args.workers,
              "modes": {MODES[m]: shlex.join(row_command("BACKEND", args, Path("RUN_DIR"), mode=m)) for m in modes},
              **({"variants": {name: shlex.join(flags) for name, flags in variants}} if args.variant else {}),
              "timing": f"{args.epochs} epochs per row; the steps of epochs 2-{args.epochs} are timed", "rows": [],
              # as this process found it; a row's cuda_queues is what its script ran with (PyTorch's sets 32 if unset)
              "cuda_device_max_connections": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")}
    if args.rounds < 1:
        raise usage_error(f"--rounds {args.rounds}: give 1 or more")
    with tempfile.TemporaryDirectory(prefix="training-speed-") as tmp:
        for k in range(args.rounds):
            for mode, (variant, flags), (backend, pipelines) in itertools.product(modes, variants, backends):
                row = run_row(backend, args, Path(tmp), round_=k + 1 if args.rounds > 1 else None, pipelines=pipelines,
                              variant=variant, flags=flags, mode=mode, label_mode=len(modes) > 1)
                report["rows"].append(row)
                name = row["label"] + (f" (round {k + 1})" if args.rounds > 1 else "")
                if "error" in row:
                    print(f"{name:28s} FAILED: {row['error']}", flush=True)
                    log = Path(tmp) / f"{row['run']}.log"
                    if log.exists():  # the failing run's log is kept beside the JSON
                        shutil.copy(log, args.out / f"training_speed_{args.framework}_{log.stem}.log")
                else:
                    mid = f"  steady {row['steady']['img_s']:,.0f} img/s" if "steady" in row else ""
                    if "gpu_wait_ms" in row:
                        mid += f"  host ahead by {row['gpu_wait_ms']['median']:.1f} ms (median)"
                    memory = f"  peak memory: GPU {row['peak_gpu_memory_mib']} MiB, host {row['peak_host_rss_mib']} MiB"
                    print(f"{name:28s} {row['img_s']:9,.0f} img/s  data wait {100 * row['data_wait_share']:4.1f} %  "
                          f"median step {row['median_step_ms']:.1f} ms{mid}{memory}", flush=True)
                path.write_text(json.dumps(report, indent=2) + "\n")
    firsts = [r for r in report["rows"] if "img_s" in r and r.get("round", 1) == 1]
    synthetic = {_group(r): r["img_s"] for r in firsts if r["backend"] == "synthetic"}
    if synthetic:  # each row over the synthetic row of its own variant and mode
        report["share_of_synthetic"] = {_label(r): r["img_s"] / synthetic[_group(r)] for r in firsts
                                        if _group(r) in synthetic}
        if all("steady" in r for r in firsts):  # the same in steady state
            mids = {_group(r): r["steady"]["img_s"] for r in firsts if r["backend"] == "synthetic"}
            report["share_of_synthetic_steady"] = {_label(r): r["steady"]["img_s"] / mids[_group(r)]
                                                   for r in firsts if _group(r) in mids}
    if args.rounds > 1:
        report["share_of_synthetic_rounds"] = _round_shares(report["rows"])
        report["share_of_synthetic_steady_rounds"] = _round_shares(report["rows"], steady=True)
        for key, what in [("share_of_synthetic_rounds", "every timed step"),
                          ("share_of_synthetic_steady_rounds", "steady state")]:
            for b, r in report[key].items():
                print(f"{b}: {100 * r['mean']:.1f} % of synthetic over {what} (rounds {100 * r['min']:.1f}-"
                      f"{100 * r['max']:.1f} %)")
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}" + (f" and {png}" if (png := plot(report, path.with_suffix(".png"))) else ""))
    return report


if __name__ == "__main__":
    main(get_args_parser().parse_args())
