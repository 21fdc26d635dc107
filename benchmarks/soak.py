"""Memory over a long run: does host or GPU memory grow once training has warmed up (docs/benchmarks.md#soak)?

    python -m benchmarks.soak                          # GPU: the PyTorch script's default command, 30 minutes
    python -m benchmarks.soak --minutes 8              # the same in one 10-minute call
    python -m benchmarks.soak --mode loader --backend native    # only iterate a loader (any backend)
    python -m benchmarks.soak --smoke                  # CPU: 2 minutes on the tiny set with dali-cpu

``--mode train`` (the default) runs the PyTorch classification script in this process, with the flags a user
types (``--data``, ``--data-backend``, ``--output-dir``, and enough ``--epochs`` to outlast the run; ``--smoke``
adds a small model, crop and batch), and stops it with SIGTERM when the time is up, as a scheduler would:
every epoch ends with the val pass and a checkpoint, and the DALI iterators are reset at each epoch boundary,
so a leak per epoch shows. ``--mode loader`` iterates ``crossdali.pytorch.create_classification_loader``'s
train split epoch after epoch (``for batch in loader`` once per epoch) and does nothing else.

Every ``--every`` seconds a background thread records the host's resident set (this process and its
children: psutil where installed, else ``/proc``), GPU memory where CUDA exists (``torch.cuda.memory_reserved``
and GPU 0's used memory as ``nvidia-smi`` reports it, with this process's share where ``nvidia-smi`` lists
it) and the images/s of the interval. Memory growth is measured from the end of the warm-up (``--warmup``;
default 20 % of the run, at least 2 intervals: allocator pools, DALI's buffers and the page cache of the data
fill up first) to the last sample: ``(last - at warm-up) / at warm-up``, and the JSON says whether each is
under 5 %. Writes ``soak.json`` (``--name``) and a PNG into ``results/latest`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks import cpu_model, gpu_name, usage_error
from benchmarks.plot import backend_color, pyplot

#: growth after the warm-up that counts as flat
GROWTH_LIMIT = 0.05
#: epochs given to the training script: more than any soak reaches, so the time limit ends the run
TRAIN_EPOCHS = 100_000
#: the memory series that growth is computed for, and how the JSON and plot name them
SERIES = {"host_rss_mib": "host RSS (process + children)", "gpu_used_mib": "GPU 0 used (nvidia-smi)",
          "torch_reserved_mib": "torch.cuda.memory_reserved"}


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, add_help=add_help,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("train", "loader"), default="train",
                        help="train: the PyTorch classification script; loader: iterate the loader only")
    parser.add_argument("--backend", default=None, choices=("dali-gpu", "dali-cpu", "native", "synthetic"),
                        help="data backend (default: dali-gpu where nvidia-smi sees a GPU, else dali-cpu)")
    parser.add_argument("--minutes", type=float, default=None, help="wall time of the run (default 30; --smoke: 2)")
    parser.add_argument("--every", type=float, default=None, help="seconds between samples (default 60; --smoke: 10)")
    parser.add_argument("--warmup", type=float, default=None,
                        help="seconds before the sample growth is measured from (default: 20 %% of the run, at least "
                             "2 intervals where the run is longer than that)")
    parser.add_argument("--data", type=Path, default=None, help="dataset (default: the --sample-size sample set)")
    parser.add_argument("--sample-size", default=None, help="sample set without --data (default bench; --smoke: tiny)")
    parser.add_argument("--arch", default=None, help="train mode: --arch of the script (default: the script's)")
    parser.add_argument("-b", "--batch-size", type=int, default=None,
                        help="batch size (default: the script's; loader mode: 256, --smoke: 32)")
    parser.add_argument("--crop-size", type=int, default=None, help="crop (default: the script's, 224; --smoke: 64)")
    parser.add_argument("-j", "--workers", type=int, default=None,
                        help="DALI threads or loader workers (default: the script's; loader mode: cores - 1)")
    parser.add_argument("--out", type=Path, default=Path("results/latest"), help="folder for the JSON and PNG")
    parser.add_argument("--name", default="soak", help="file name of the JSON and PNG, without suffix")
    parser.add_argument("--plot", type=Path, default=None, metavar="JSON", help="only draw the PNG of a written JSON")
    parser.add_argument("--smoke", action="store_true",
                        help="a short CPU run: 2 minutes, a sample every 10 s, tiny set, dali-cpu, small_cnn at crop 64, "
                             "batch 32")
    return parser


# --- what is measured -------------------------------------------------------------------------------------------

def _proc_children(pid: int) -> list[int]:
    """The children of ``pid`` and theirs, from ``/proc/PID/task/TID/children``."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


def _proc_rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:  # the child ended between listing and reading
        pass
    return 0


def host_rss_mib() -> float:
    """The resident set of this process and all its children (DataLoader workers, helpers), in MiB."""
    try:
        import psutil
    except ImportError:
        pid = os.getpid()
        return sum(_proc_rss_kib(p) for p in [pid, *_proc_children(pid)]) / 1024
    me = psutil.Process()
    total = me.memory_info().rss
    for child in me.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def gpu_memory_mib() -> tuple[float | None, float | None]:
    """GPU 0's used memory as ``nvidia-smi`` reports it, and this process's share where it lists the process
    (it does not inside some containers); ``(None, None)`` without ``nvidia-smi``."""
    if shutil.which("nvidia-smi") is None:
        return None, None
    used = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True)
    apps = subprocess.run(["nvidia-smi", "-i", "0", "--query-compute-apps=pid,used_memory",
                           "--format=csv,noheader,nounits"], capture_output=True, text=True)
    total = float(used.stdout.split()[0]) if used.returncode == 0 and used.stdout.strip() else None
    mine = None
    for line in apps.stdout.splitlines() if apps.returncode == 0 else []:
        pid, _, mib = (s.strip() for s in line.partition(","))
        if pid == str(os.getpid()) and mib.isdigit():
            mine = float(mib)
    return total, mine


def torch_reserved_mib() -> float | None:
    """``torch.cuda.memory_reserved`` of GPU 0 once this process has started CUDA (``None`` before, or without
    torch or CUDA): what PyTorch's caching allocator holds, DALI's own buffers not included."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda.memory_reserved(0) / 2**20


class Sampler(threading.Thread):
    """Takes a sample at the start, every ``every`` seconds and at ``seconds``, then calls ``on_deadline`` (which
    makes the main thread stop). ``progress()`` returns the images and epochs done so far."""

    def __init__(self, *, seconds: float, every: float, progress: Callable[[], tuple[int, int]],
                 on_deadline: Callable[[], None]) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        self.seconds, self.every, self.progress, self.on_deadline = seconds, every, progress, on_deadline
        self.samples: list[dict] = []
        self.finished = threading.Event()  # set by the main thread if its work ends before the deadline
        self.t0 = time.monotonic()

    def sample(self) -> None:
        images, epochs = self.progress()
        gpu_used, gpu_process = gpu_memory_mib()
        now = time.monotonic() - self.t0
        previous = self.samples[-1] if self.samples else None
        interval = now - previous["t_s"] if previous else 0.0
        row = {"t_s": round(now, 2), "images": images, "epochs": epochs,
               "img_s": round((images - previous["images"]) / interval, 1) if previous and interval > 0 else None,
               "host_rss_mib": round(host_rss_mib(), 1), "gpu_used_mib": gpu_used, "gpu_process_mib": gpu_process,
               "torch_reserved_mib": torch_reserved_mib()}
        self.samples.append(row)
        print(f"soak {now / 60:6.2f} min  epochs {epochs:5d}  {row['img_s'] or 0:9,.1f} img/s  host RSS "
              f"{row['host_rss_mib']:9,.1f} MiB  GPU used {gpu_used} MiB  torch reserved "
              f"{row['torch_reserved_mib'] and round(row['torch_reserved_mib'], 1)} MiB", file=sys.stderr, flush=True)

    def run(self) -> None:
        self.sample()
        k = 1
        while True:
            due = min(k * self.every, self.seconds)
            if self.finished.wait(max(0.0, due - (time.monotonic() - self.t0))):
                self.sample()  # the main thread's work ended early: its last state
                return
            self.sample()
            if due >= self.seconds:
                break
            k += 1
        self.on_deadline()


# --- what runs --------------------------------------------------------------------------------------------------

class MetricsProgress:
    """Images and finished epochs from the training script's ``metrics.jsonl`` (its ``step`` and ``epoch``
    records), read on from where the last call stopped."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.rest, self.images, self.epochs = path, 0, "", 0, 0

    def __call__(self) -> tuple[int, int]:
        if self.path.exists():
            with self.path.open() as f:
                f.seek(self.offset)
                text = self.rest + f.read()
                self.offset = f.tell()
            *lines, self.rest = text.split("\n")
            for line in lines:
                record = json.loads(line)
                if record.get("event") == "step":
                    self.images += record["samples"]
                elif record.get("event") == "epoch":
                    self.epochs = record["epoch"]
        return self.images, self.epochs


def train_argv(args: argparse.Namespace, run_dir: Path) -> list[str]:
    """The PyTorch classification script's flags for this soak."""
    argv = ["--data", str(args.data), "--data-backend", args.backend, "--epochs", str(TRAIN_EPOCHS),
            "--output-dir", str(run_dir)]
    for flag, value in (("--arch", args.arch), ("-b", args.batch_size), ("--crop-size", args.crop_size),
                        ("-j", args.workers)):
        if value is not None:
            argv += [flag, str(value)]
    return argv


def soak_training(args: argparse.Namespace, work: Path) -> Sampler:
    """The training script in this process (its entry point, ``crossdali.common.scripts.script.run``) until
    the sampler's deadline sends SIGTERM; the script then finishes its step, saves a checkpoint and exits 143."""
    from crossdali.common.scripts.script import run
    from crossdali.pytorch import train_classification

    run_dir = work / "run"

    def stop() -> None:  # SIGTERM only once the script handles it (before that, it would kill this process)
        while signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None) and not sampler.finished.is_set():
            time.sleep(0.5)
        if not sampler.finished.is_set():
            os.kill(os.getpid(), signal.SIGTERM)

    sampler = Sampler(seconds=60 * args.minutes, every=args.every, progress=MetricsProgress(run_dir / "metrics.jsonl"),
                      on_deadline=stop)
    sampler.start()
    try:
        run(train_classification.main, train_classification.get_args_parser(), train_argv(args, run_dir))
    except SystemExit as e:
        if e.code != 128 + signal.SIGTERM:  # a user's mistake (already printed in one line) or a failed run
            sampler.finished.set()
            raise
    sampler.finished.set()
    sampler.join()
    return sampler


def soak_loader(args: argparse.Namespace) -> Sampler:
    """Epoch after epoch over the loader's train split until the sampler's deadline."""
    from crossdali.pytorch import create_classification_loader

    done = {"images": 0, "epochs": 0}
    deadline = threading.Event()
    sampler = Sampler(seconds=60 * args.minutes, every=args.every, progress=lambda: (done["images"], done["epochs"]),
                      on_deadline=deadline.set)
    loader = create_classification_loader(args.data, train=True, backend=args.backend, batch_size=args.batch_size,
                                          crop_size=args.crop_size, workers=args.workers)
    sampler.t0 = time.monotonic()  # the run starts with the first batch, as training would, after the build
    sampler.start()
    while not deadline.is_set():
        for images, _labels in loader:  # one epoch; the next ``for`` resets the DALI iterator
            done["images"] += images.shape[0]
            if deadline.is_set():
                break
        else:
            done["epochs"] += 1
    sampler.join()
    return sampler


# --- the report -------------------------------------------------------------------------------------------------

def growth(samples: list[dict], warmup_s: float) -> dict:
    """Per memory series: the sample at the end of the warm-up, the last one, the growth between them and
    whether it is under ``GROWTH_LIMIT``; ``None`` values where the series was not measured."""
    warm = next((s for s in samples if s["t_s"] >= warmup_s), None)
    out = {}
    for key in SERIES:
        values = [s[key] for s in samples if s["t_s"] >= warmup_s and s[key] is not None]
        if warm is None or warm[key] is None or warm is samples[-1] or samples[-1][key] is None or not warm[key]:
            out[key] = None
            continue
        change = (samples[-1][key] - warm[key]) / warm[key]
        out[key] = {"at_warmup_mib": warm[key], "last_mib": samples[-1][key], "max_after_warmup_mib": max(values),
                    "growth": round(change, 4), "under_5_percent": change < GROWTH_LIMIT}
    return out


def plot(report: dict, png: Path) -> Path | None:
    plt = pyplot()
    samples = report["samples"]
    if plt is None or len(samples) < 2:
        return None
    minutes = [s["t_s"] / 60 for s in samples]
    fig, (mem, speed) = plt.subplots(1, 2, figsize=(13, 4.8), layout="constrained")
    for key, label in SERIES.items():
        if any(s[key] is not None for s in samples):
            verdict = report["growth"].get(key)
            suffix = f", {100 * verdict['growth']:+.1f} % after warm-up" if verdict else ""
            mem.plot(minutes, [s[key] for s in samples], marker=".", label=label + suffix)
    mem.axvline(report["warmup_s"] / 60, color="#999999", linestyle="--", linewidth=1)
    mem.set_xlabel("minutes (dashed: end of warm-up)")
    mem.set_ylabel("MiB")
    mem.set_ylim(bottom=0)
    mem.legend(fontsize=8, loc="lower right")
    where = report["device"] if report.get("gpu") else f"{report['cpu']}, {report['cpu_count']} cores"
    mem.set_title(f"memory, {report['mode']} mode, {report['backend']}\n{where}")
    rate = [(m, s["img_s"]) for m, s in zip(minutes, samples) if s["img_s"] is not None]
    speed.plot([m for m, _ in rate], [r for _, r in rate], marker=".", color=backend_color(report["backend"]))
    speed.set_ylim(bottom=0)
    speed.set_xlabel("minutes")
    speed.set_ylabel("images/s over the interval")
    speed.set_title(f"images/s per {report['every_s']:g} s interval; {samples[-1]['epochs']} epochs in "
                    f"{report['minutes']:g} min")
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def _defaults(args: argparse.Namespace) -> None:
    """Fill in what the flags left out, and refuse what cannot run, in one line each."""
    gpu = gpu_name()
    args.minutes = args.minutes if args.minutes is not None else 2 if args.smoke else 30
    args.every = args.every if args.every is not None else 10 if args.smoke else 60
    args.backend = args.backend or ("dali-cpu" if args.smoke or gpu is None else "dali-gpu")
    if args.backend == "dali-gpu" and gpu is None:
        raise usage_error("--backend dali-gpu: nvidia-smi finds no GPU here; use --backend dali-cpu (or --smoke)")
    if args.minutes <= 0 or not math.isfinite(args.minutes):
        raise usage_error(f"--minutes {args.minutes:g}: give a positive number of minutes, e.g. --minutes 8")
    if args.every <= 0 or args.every > 60 * args.minutes:
        raise usage_error(f"--every {args.every:g}: give seconds between samples, more than 0 and at most the run's "
                          f"{60 * args.minutes:g} s")
    if args.warmup is None:  # 2 intervals at least, where the run has more than that
        run = 60 * args.minutes
        args.warmup = max(0.2 * run, 2 * args.every) if 2 * args.every < run else 0.2 * run
    if not 0 <= args.warmup < 60 * args.minutes:
        raise usage_error(f"--warmup {args.warmup:g}: give seconds before the end of the run ({60 * args.minutes:g} s)")
    if args.smoke:
        args.sample_size = args.sample_size or "tiny"
        args.arch, args.crop_size = args.arch or "small_cnn", args.crop_size or 64
        args.batch_size = args.batch_size or 32
    args.sample_size = args.sample_size or "bench"
    if args.mode == "loader":
        args.batch_size, args.crop_size = args.batch_size or 256, args.crop_size or 224
        args.workers = args.workers or max(1, (os.cpu_count() or 2) - 1)
    if args.data is None:
        from crossdali.common.data.sample_data import SIZES, ensure_classification

        if args.sample_size not in SIZES:
            raise usage_error(f"--sample-size {args.sample_size!r}: choose one of {', '.join(sorted(SIZES))}")
        args.data = ensure_classification(size=args.sample_size, formats=("imagefolder",)) / "imagefolder"
    elif not args.data.is_dir():
        raise usage_error(f"--data {args.data}: no such folder; give an ImageFolder with train/ and val/")


def main(args: argparse.Namespace) -> dict:
    if args.plot is not None:
        report = json.loads(args.plot.read_text())
        print(f"wrote {plot(report, args.plot.with_suffix('.png'))}")
        return report
    _defaults(args)
    args.out.mkdir(parents=True, exist_ok=True)
    import nvidia.dali

    with tempfile.TemporaryDirectory(prefix="soak-") as work:
        what = (f"crossdali train classification --framework pytorch {shlex.join(train_argv(args, Path('RUN_DIR')))}"
                if args.mode == "train" else
                f"crossdali.pytorch.create_classification_loader(DATA, train=True, backend={args.backend!r}, "
                f"batch_size={args.batch_size}, crop_size={args.crop_size}, workers={args.workers})")
        print(f"soak: {args.minutes:g} min of {what}, a sample every {args.every:g} s", file=sys.stderr, flush=True)
        sampler = soak_training(args, Path(work)) if args.mode == "train" else soak_loader(args)
    samples = sampler.samples
    report = {"benchmark": "soak", "command": shlex.join(["python", "-m", "benchmarks.soak", *sys.argv[1:]]),
              "mode": args.mode, "runs": what, "backend": args.backend, "data": str(args.data),
              "device": gpu_name() or cpu_model(), "gpu": gpu_name(), "cpu": cpu_model(), "cpu_count": os.cpu_count(),
              "dali": nvidia.dali.__version__, "torch": sys.modules["torch"].__version__,
              "python": platform.python_version(), "minutes": args.minutes, "every_s": args.every,
              "warmup_s": args.warmup, "growth_limit": GROWTH_LIMIT,
              "growth": growth(samples, args.warmup), "samples": samples}
    measured = [g for g in report["growth"].values() if g is not None]
    # None where no series has a sample after the warm-up's (too short a run for its --every)
    report["memory_flat"] = all(g["under_5_percent"] for g in measured) if measured else None
    path = args.out / f"{args.name}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    for key, g in report["growth"].items():
        if g is not None:
            print(f"{SERIES[key]}: {g['at_warmup_mib']:,.1f} MiB at warm-up, {g['last_mib']:,.1f} MiB at the end "
                  f"({100 * g['growth']:+.2f} %, {'under' if g['under_5_percent'] else 'NOT under'} 5 %)")
    png = plot(report, path.with_suffix(".png"))
    print(f"wrote {path}" + (f" and {png}" if png else ""))
    return report


if __name__ == "__main__":
    main(get_args_parser().parse_args())
