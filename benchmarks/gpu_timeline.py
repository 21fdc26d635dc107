"""Where a training step's GPU time goes with DALI beside it: an Nsight Systems trace of the classification
script's default command per data backend, summarised per training epoch and per step
(docs/benchmarks.md#where-dalis-cost-lands).

    python -m benchmarks.gpu_timeline --framework jax            # synthetic and dali-gpu, a trace each, compared
    python -m benchmarks.gpu_timeline --summarize run.sqlite --epochs 3 --steps-per-epoch 33   # your own export

Each backend runs ``crossdali train classification --framework F --data DIR --data-backend B --epochs N`` (the
bench set unless ``--data``) under ``nsys profile -t cuda --cuda-graph-trace=node`` (kernels inside CUDA graphs,
which XLA's command buffers and the PyTorch script's captured steps launch, are traced one by one), exports the
report to SQLite and reads its kernels and copies:

* kernels on a CUDA stream where DALI's or nvJPEG's kernels ran are DALI's, all others the framework's;
* the framework's kernels fall into stretches wherever the GPU idles ``SPLIT_MS`` or more (start-up, compilation,
  validation); the N stretches holding the most kernels are the N training epochs, and epoch 1 (the warm-up) is
  left out of the per-step figures;
* per step (the script's own step count, from its ``metrics.jsonl``): the framework's kernel time (``busy``), the
  rest of the step (``idle``) split into gaps under ``LONG_GAP_MS`` (between kernels the GPU had queued) and longer
  ones (the GPU waiting for the host to launch work, or for another stream), DALI's kernel time and launches, and
  the copies by kind.

With ``synthetic`` and ``dali-gpu`` both run, ``compared`` gives what DALI adds to each part of a step: whether
the framework's kernels run slower beside DALI's, or the GPU waits longer between them. Writes
``gpu_timeline_<framework>.json`` (+ a PNG) into ``--out``. Needs ``nsys`` (``--nsys PATH``) and a CUDA GPU;
``--summarize`` needs neither.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import bench_set, gpu_name, usage_error
from benchmarks.plot import backend_color, pyplot
from crossdali.common.scripts.metrics import read_metrics

SPLIT_MS = 20.0  #: GPU idle time that separates two stretches of framework kernels
LONG_GAP_MS = 0.1  #: idle gaps at least this long are counted apart from the gaps between queued kernels
DALI_MARKERS = ("dali::", "nvjpeg", "nvimgcodec")  #: kernel names (lower case) that mark a stream as DALI's
#: CUPTI's copy kinds as nsys exports them
COPY_KINDS = {1: "host_to_device", 2: "device_to_host", 8: "device_to_device", 9: "host_to_host", 10: "peer_to_peer"}
TOP_KERNELS = 12

Interval = tuple[int, int]


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, add_help=add_help,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--framework", choices=("pytorch", "tensorflow", "jax"), default="jax")
    parser.add_argument("--backends", default="synthetic,dali-gpu", help="comma-separated, in run order")
    parser.add_argument("--epochs", type=int, default=3, help="epoch 1 is the warm-up; the others are summarised")
    parser.add_argument("--data", type=Path, default=None, help="image folder (default: the bench sample set)")
    parser.add_argument("--out", type=Path, default=Path("results/latest"), help="folder for the JSON and PNG")
    parser.add_argument("--nsys", default=None, help="the nsys program (default: nsys on PATH)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per traced run")
    parser.add_argument("--summarize", type=Path, default=None, metavar="SQLITE",
                        help="only summarise this nsys SQLite export (nsys export --type sqlite)")
    parser.add_argument("--steps-per-epoch", type=int, default=None,
                        help="with --summarize: training steps per epoch, for the per-step figures")
    return parser


# --------------------------------------------------------------------------------------------
# The trace
# --------------------------------------------------------------------------------------------


def read_trace(path: Path) -> tuple[list[tuple[int, int, int, str]], list[tuple[int, int, int, int, int]]]:
    """Kernels ``(start, end, stream, name)`` in start order and copies ``(start, end, stream, kind, bytes)``
    of an nsys SQLite export; a file that is not one is a usage error naming it."""
    if not path.is_file():
        raise usage_error(f"{path}: no such file (export a report with: nsys export --type sqlite -o {path} REPORT)")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        names = dict(db.execute("SELECT id, value FROM StringIds"))
        kernels = [(a, b, s, names.get(n, "?")) for a, b, s, n in db.execute(
            "SELECT start, end, streamId, demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start")]
    except sqlite3.DatabaseError as e:
        raise usage_error(f"{path}: not an nsys SQLite export with CUDA kernels ({e}); trace with nsys profile "
                          "-t cuda and export with nsys export --type sqlite") from None
    try:
        copies = list(db.execute("SELECT start, end, streamId, copyKind, bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY"))
    except sqlite3.DatabaseError:  # a trace without any copy has no such table
        copies = []
    db.close()
    return kernels, copies


def union(intervals: list[Interval]) -> list[list[int]]:
    """The time covered by ``intervals``, as sorted disjoint ``[start, end]`` pairs."""
    out: list[list[int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def covered(spans: list[list[int]]) -> int:
    return sum(b - a for a, b in spans)


def overlap(u: list[list[int]], v: list[list[int]]) -> int:
    """Time covered by both of two ``union`` results."""
    i = j = total = 0
    while i < len(u) and j < len(v):
        total += max(0, min(u[i][1], v[j][1]) - max(u[i][0], v[j][0]))
        if u[i][1] < v[j][1]:
            i += 1
        else:
            j += 1
    return total


def training_epochs(framework: list[tuple[int, int, int, str]], epochs: int) -> list[Interval]:
    """The ``epochs`` stretches of framework kernels (split where the GPU idles ``SPLIT_MS``) holding the most
    kernels, in time order: the training epochs, whose steps launch far more kernels than anything else."""
    split = int(SPLIT_MS * 1e6)
    stretches: list[list[int]] = []  # start, end, kernels
    for a, b, *_ in framework:
        if stretches and a - stretches[-1][1] < split:
            stretches[-1][1] = max(stretches[-1][1], b)
            stretches[-1][2] += 1
        else:
            stretches.append([a, b, 1])
    if len(stretches) < epochs:
        raise usage_error(f"the trace has {len(stretches)} stretch(es) of framework kernels, fewer than --epochs "
                          f"{epochs}: pass the number of epochs the traced run trained")
    chosen = sorted(sorted(stretches, key=lambda s: -s[2])[:epochs])
    return [(a, b) for a, b, _ in chosen]


def _within(rows: list[tuple], lo: int, hi: int) -> list[tuple]:
    """``rows`` (start, end, ...) that overlap ``[lo, hi)``, clipped to it."""
    return [(max(r[0], lo), min(r[1], hi), *r[2:]) for r in rows if r[1] > lo and r[0] < hi]


def is_dali(name: str) -> bool:
    lowered = name.lower()
    return any(marker in lowered for marker in DALI_MARKERS)


def summarize(kernels, copies, *, epochs: int, steps_per_epoch: int | None = None) -> dict:
    """Per-epoch and per-step figures of one trace (see the module docstring)."""
    dali_streams = {s for _, _, s, name in kernels if is_dali(name)}
    framework = [k for k in kernels if k[2] not in dali_streams]
    dali = [k for k in kernels if k[2] in dali_streams]
    if not framework:
        raise usage_error("the trace holds no framework kernels: was the training script traced with -t cuda?")
    long_gap = int(LONG_GAP_MS * 1e6)
    per_epoch, dali_timed = [], []
    for number, (lo, hi) in enumerate(training_epochs(framework, epochs), start=1):
        fw, dl = _within(framework, lo, hi), _within(dali, lo, hi)
        busy, dali_busy = union([(a, b) for a, b, *_ in fw]), union([(a, b) for a, b, *_ in dl])
        gaps = [busy[k + 1][0] - busy[k][1] for k in range(len(busy) - 1)]
        long = [g for g in gaps if g >= long_gap]
        moved: dict[str, dict] = {}
        for a, b, stream, kind, nbytes in _within(copies, lo, hi):
            entry = moved.setdefault(f"{'dali' if stream in dali_streams else 'framework'}_"
                                     f"{COPY_KINDS.get(kind, f'kind{kind}')}", {"count": 0, "MB": 0.0, "ms": 0.0})
            entry["count"] += 1
            entry["MB"] += nbytes / 1e6
            entry["ms"] += (b - a) / 1e6
        span = hi - lo
        per_epoch.append({
            "epoch": number, "ms": span / 1e6, "framework_kernels": len(fw),
            "framework_busy_ms": covered(busy) / 1e6, "idle_ms": (span - covered(busy)) / 1e6,
            "idle_long_gaps_ms": sum(long) / 1e6, "long_gaps": len(long),
            "idle_short_gaps_ms": (span - covered(busy) - sum(long)) / 1e6,
            "dali_kernels": len(dl), "dali_kernel_ms": sum(b - a for a, b, *_ in dl) / 1e6,
            "dali_busy_ms": covered(dali_busy) / 1e6, "dali_beside_framework_ms": overlap(busy, dali_busy) / 1e6,
            "copies": {k: {"count": v["count"], "MB": round(v["MB"], 1), "ms": round(v["ms"], 3)}
                       for k, v in sorted(moved.items())}})
        if number > 1:
            dali_timed += dl
    timed = per_epoch[1:]  # epoch 1 is the warm-up (main asks for 2 epochs or more)
    report = {"dali_streams": len(dali_streams), "epochs": per_epoch, "timed_epochs": [e["epoch"] for e in timed]}
    if steps_per_epoch:
        steps = steps_per_epoch * len(timed)
        keys = ("ms", "framework_busy_ms", "idle_ms", "idle_short_gaps_ms", "idle_long_gaps_ms", "dali_kernel_ms")
        report["steps_per_epoch"] = steps_per_epoch
        report["per_step"] = {("step_ms" if k == "ms" else k): sum(e[k] for e in timed) / steps for k in keys}
        report["per_step"]["framework_kernels"] = sum(e["framework_kernels"] for e in timed) / steps
        report["per_step"]["dali_launches"] = sum(e["dali_kernels"] for e in timed) / steps
        totals: dict[str, list[float]] = {}
        for a, b, _, name in dali_timed:
            entry = totals.setdefault(name, [0, 0.0])
            entry[0] += 1
            entry[1] += b - a
        report["dali_kernels_per_step"] = [
            {"name": name[:200], "launches": n / steps, "mean_us": t / n / 1e3, "ms": t / steps / 1e6}
            for name, (n, t) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:TOP_KERNELS]]
    return report


def compare(rows: dict[str, dict]) -> dict:
    """What each backend adds to a step over ``synthetic`` (per-step figures, ms)."""
    base = rows.get("synthetic", {}).get("per_step")
    if not base:
        return {}
    return {backend: {k: row["per_step"][k] - base[k] for k in base}
            for backend, row in rows.items() if backend != "synthetic" and row.get("per_step")}


# --------------------------------------------------------------------------------------------
# Traced runs
# --------------------------------------------------------------------------------------------


def _report_file(trace: Path, nsys: str) -> Path:
    """The ``.nsys-rep`` of a finished trace. Some nsys builds (the one inside Nsight Compute) leave a ``.qdstrm``
    for their ``QdstrmImporter`` to convert: run it where it is found beside nsys."""
    report = trace.with_suffix(".nsys-rep")
    raw = trace.with_suffix(".qdstrm")
    if not report.is_file() and raw.is_file():
        importers = sorted(Path(nsys).resolve().parents[1].glob("*/QdstrmImporter"))
        if importers:
            subprocess.run([str(importers[0]), "-i", str(raw)], capture_output=True, check=False)
    if not report.is_file():
        left = f" (only {raw.name}: convert it with QdstrmImporter)" if raw.is_file() else ""
        raise usage_error(f"nsys wrote no report {report}{left}; run the command under nsys yourself and pass "
                          "--summarize")
    return report


def trace_backend(args, backend: str, data: Path, nsys: str, work: Path) -> dict:
    """One traced run of the default command; its summary with the script's steps per epoch."""
    trace, run_dir = work / backend, work / f"run-{backend}"
    command = [sys.executable, "-m", "crossdali", "train", "classification", "--framework", args.framework,
               "--data", str(data), "--data-backend", backend, "--epochs", str(args.epochs),
               "--output-dir", str(run_dir)]
    print(f"{backend}: tracing {' '.join(command[1:])}", flush=True)
    proc = subprocess.run([nsys, "profile", "-t", "cuda", "--cuda-graph-trace=node", "-s", "none", "--cpuctxsw=none",
                           "--force-overwrite", "true", "-o", str(trace), *command],
                          capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{backend}: the traced run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    sqlite = trace.with_suffix(".sqlite")
    export = subprocess.run([nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "-o", str(sqlite),
                             str(_report_file(trace, nsys))], capture_output=True, text=True, timeout=args.timeout)
    if export.returncode != 0:
        raise RuntimeError(f"{backend}: nsys export failed (exit {export.returncode}):\n{export.stderr[-3000:]}")
    metrics = next(run_dir.rglob("metrics.jsonl"), None)
    if metrics is None:
        raise RuntimeError(f"{backend}: the traced run wrote no metrics.jsonl under {run_dir}")
    records = read_metrics(metrics.parent)
    steps = sum(1 for r in records if r.get("event") == "step" and r.get("epoch") == args.epochs)
    kernels, copies = read_trace(sqlite)
    return {"command": " ".join(["crossdali", *command[3:]]), **summarize(kernels, copies, epochs=args.epochs,
                                                                          steps_per_epoch=steps)}


def print_rows(rows: dict[str, dict]) -> None:
    for backend, row in rows.items():
        s = row.get("per_step")
        if s:
            print(f"{backend:<12} step {s['step_ms']:6.2f} ms: framework kernels {s['framework_busy_ms']:6.2f}, idle "
                  f"{s['idle_ms']:5.2f} (short gaps {s['idle_short_gaps_ms']:.2f}, long {s['idle_long_gaps_ms']:.2f}); "
                  f"DALI kernels {s['dali_kernel_ms']:.2f} ms in {s['dali_launches']:.0f} launches")


def plot(report: dict, png: Path) -> Path | None:
    """One stacked bar per backend: a step's framework kernels, short gaps and long gaps."""
    plt = pyplot()
    rows = {b: r["per_step"] for b, r in report["rows"].items() if r.get("per_step")}
    if plt is None or not rows:
        return None
    fig, ax = plt.subplots(figsize=(9, 1.8 + 0.6 * len(rows)), layout="constrained")
    left = [0.0] * len(rows)
    for key, label, alpha in (("framework_busy_ms", "framework kernels", 1.0),
                              ("idle_short_gaps_ms", "gaps < 0.1 ms", 0.55), ("idle_long_gaps_ms", "longer gaps", 0.3)):
        values = [r[key] for r in rows.values()]
        ax.barh(list(rows), values, left=left, label=label, alpha=alpha,
                color=[backend_color(b) for b in rows])
        left = [a + b for a, b in zip(left, values, strict=True)]
    for y, r in enumerate(rows.values()):
        ax.text(left[y], y, f" {r['step_ms']:.1f} ms (DALI kernels {r['dali_kernel_ms']:.2f} ms)", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(left) * 1.35)
    ax.set_xlabel("ms per training step")
    ax.set_title(f"{report['framework']} default command, {report['device']}")
    fig.legend(loc="outside lower center", ncol=3, fontsize=8)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def main(args: argparse.Namespace) -> dict:
    if args.epochs < 2:
        raise usage_error(f"--epochs {args.epochs}: give at least 2 (epoch 1 is the warm-up)")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.summarize is not None:
        kernels, copies = read_trace(args.summarize)
        row = summarize(kernels, copies, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch)
        out = args.out / f"gpu_timeline_{args.summarize.stem}.json"
        out.write_text(json.dumps({"benchmark": "gpu_timeline", "trace": str(args.summarize), **row}, indent=1) + "\n")
        print_rows({args.summarize.stem: row})
        if args.steps_per_epoch is None:
            print("per-epoch figures only: pass --steps-per-epoch for the per-step ones")
        print(f"wrote {out}")
        return row
    nsys = args.nsys or shutil.which("nsys")
    if nsys is None or not Path(nsys).is_file():
        raise usage_error(f"{'--nsys ' + args.nsys if args.nsys else 'nsys'}: Nsight Systems' nsys not found; install "
                          "it, or pass --nsys PATH")
    device = gpu_name()
    if device is None:
        raise usage_error("benchmarks.gpu_timeline traces a CUDA GPU's kernels: no GPU here (nvidia-smi found none)")
    data = args.data if args.data is not None else bench_set()
    report = {"benchmark": "gpu_timeline", "framework": args.framework, "device": device, "epochs": args.epochs,
              "split_ms": SPLIT_MS, "long_gap_ms": LONG_GAP_MS, "rows": {}}
    out = args.out / f"gpu_timeline_{args.framework}.json"
    with tempfile.TemporaryDirectory(prefix="gpu-timeline-") as work:
        for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
            report["rows"][backend] = trace_backend(args, backend, data, nsys, Path(work))
            report["compared"] = compare(report["rows"])
            out.write_text(json.dumps(report, indent=1) + "\n")
    print_rows(report["rows"])
    png = plot(report, out.with_suffix(".png"))
    print(f"wrote {out}" + (f" and {png}" if png else ""))
    return report


if __name__ == "__main__":
    main(get_args_parser().parse_args())
