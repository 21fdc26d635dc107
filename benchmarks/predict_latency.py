"""Latency of ``Predictor`` with DALI's eager engine (dynamic mode) and with its pipeline engine, against
PIL + torchvision transforms, per image and per batch of 64; the crossover that sets the ``auto``
rule (``crossdali.common.inference.EAGER_MAX_IMAGES``); and the cold start of each engine.

    python -m benchmarks.predict_latency                           # on a GPU machine: ResNet-50, 224 px (results/latest)
    python -m benchmarks.predict_latency --smoke --out /tmp/pl     # tiny CPU run: checks the script runs

Images: the ``bench`` sample set's val JPEGs (500-700 px), read into memory once. One model (random
weights, float32, eval, ``torch.inference_mode``; cuDNN autotuning on the GPU) serves every row. Rows:

- eager (CPU runs: the engine is CPU-only, docs/inference.md#eager-is-cpu-only): ``Predictor(engine="eager")``,
  DALI's operators called directly (``crossdali.common.eager``);
- pipeline: ``Predictor(engine="pipeline")``, the long-lived DALI pipeline;
- PIL + torchvision: PIL decode and torchvision's eval preset (``crossdali.pytorch.presets``) on the CPU,
  then the batch to the device;
- PIL + torchvision on the GPU (GPU runs): PIL decode, the uint8 image to the GPU, the same preset there.

DALI rows use ``--workers`` threads and the GPU decoder on a GPU; the PIL rows decode a batch of 64 in a
pool of ``--workers`` threads. Measured, in ``--rounds`` interleaved rounds (every row once per round):

- per image: ``--requests`` requests of one image, one after the other, from encoded bytes to the top-5
  classes on the host (median and 90th percentile), and the preprocessing alone (median);
- per batch: ``--batches`` batches of ``--batch-size`` (64), the same two times per batch;
- crossover (eager and pipeline): preprocessing alone for runs of ``--sweep`` images; ``eager_max_images`` is
  the largest run size up to which eager was never slower: the value for ``EAGER_MAX_IMAGES``;
- cold start: in ``--cold-starts`` fresh processes per engine, a new ``Predictor`` to its first top-5 (torch, CUDA
  and DALI's base module already imported): what one ``crossdali predict IMAGE`` pays for its engine;
  ``eager_starts_faster`` (medians) is the value for ``EAGER_STARTS_FASTER``.

Writes ``predict_latency.json`` (rewritten as rows finish) and ``predict_latency.png``; ``--cpu`` runs
write ``predict_latency_cpu.*``.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from benchmarks import cpu_model, gpu_name, round_spread, usage_error
from benchmarks.loader_rows import environment, sync
from benchmarks.plot import backend_color, bars, pyplot

ENGINE_ROWS = ("eager", "pipeline")
EAGER_COLOR = "#e69f00"  # the pipeline rows keep the DALI backend's colour of every other chart


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, add_help=add_help,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results/latest"), help="folder for the JSON and the PNG")
    parser.add_argument("--data-root", type=Path, default=None, help="where to build the sample set")
    parser.add_argument("--size", default="bench", help="sample set size (its val split is read)")
    parser.add_argument("--arch", default="resnet50")
    parser.add_argument("--crop-size", type=int, default=224)
    parser.add_argument("-b", "--batch-size", type=int, default=64)
    parser.add_argument("--requests", type=int, default=100, help="timed one-image requests per row and round")
    parser.add_argument("--batches", type=int, default=8, help="timed batches per row and round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds: every row once per round")
    parser.add_argument("--sweep", default="1,2,4,8,16,32,64", help="run sizes of the crossover (preprocessing alone)")
    parser.add_argument("--sweep-runs", type=int, default=20, help="timed runs per size, engine and round")
    parser.add_argument("--cold-starts", type=int, default=3, help="fresh processes per engine (0: skip)")
    parser.add_argument("--workers", type=int, default=8, help="DALI threads / PIL pool threads")
    parser.add_argument("--warmup", type=int, default=5, help="untimed requests and batches per row before round 1")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even where a GPU is visible")
    parser.add_argument("--smoke", action="store_true", help="tiny set, CPU, ResNet-18 at 64 px, few repeats")
    parser.add_argument("--cold-start", choices=ENGINE_ROWS, help=argparse.SUPPRESS)  # the child of a cold start
    parser.add_argument("--image", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--in-child", action="store_true", help=argparse.SUPPRESS)  # the measuring process
    parser.add_argument("--skip", default="", help=argparse.SUPPRESS)  # row kinds a crash took out, comma-separated
    return parser


ROW_MARK = "@@row "  # a child's line naming the row it starts on: a crash is pinned on the last one


def _mark(args: argparse.Namespace, kind: str) -> None:
    if args.in_child:
        print(ROW_MARK + kind, flush=True)


def _run_in_children(args: argparse.Namespace, path: Path) -> dict:
    """The measurement in a child process, so that a crash of one engine (DALI aborts the process on a CUDA
    error) costs that row only: the row the child was on is recorded with the error and a new child measures
    the others (the JSON the last child wrote, plus the rows that crashed)."""
    crashed: dict[str, str] = {}
    root = Path(__file__).resolve().parents[1]
    while True:
        cmd = [sys.executable, "-m", "benchmarks.predict_latency", *sys.argv[1:], "--in-child",
               "--skip", ",".join(crashed)]
        proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        row, tail = None, []
        for line in proc.stdout:
            if line.startswith(ROW_MARK):
                row = line[len(ROW_MARK):].strip()
                continue
            print(line, end="", flush=True)
            tail = [*tail[-19:], line.rstrip()]
        if proc.wait() == 0:
            break
        last = next((t for t in reversed(tail) if t.strip()), f"exit status {proc.returncode}")
        if row is None or row in crashed:  # not in a row, or a row already left out: nothing more to skip
            raise SystemExit(f"predict_latency: the measuring process failed ({last})")
        crashed[row] = f"the process crashed (exit status {proc.returncode}): {last}"
        print(f"{row}: CRASHED, measuring the other rows in a new process: {last}", flush=True)
    report = json.loads(path.read_text())
    for kind, error in crashed.items():
        if kind == "cold-start":
            report["cold_start"] = {"error": error}
        else:
            report["results"].append({"name": kind, "kind": kind, "error": error})
    path.write_text(json.dumps(report, indent=2) + "\n")
    return report


class PILPreprocess:
    """PIL decode + torchvision's eval preset, on the CPU (``on_gpu=False``: the float batch is moved) or
    with the decoded uint8 image moved first and the preset run on ``device``."""

    def __init__(self, crop: int, workers: int, device: torch.device, *, on_gpu: bool) -> None:
        from crossdali.common.classification import ClassificationTransform
        from crossdali.pytorch.presets import ClassificationPresetEval

        self.preset = ClassificationPresetEval(transform=ClassificationTransform(crop_size=crop))
        self.device, self.on_gpu = device, on_gpu
        self.pool = ThreadPoolExecutor(workers)

    def one(self, data: bytes) -> torch.Tensor:
        from PIL import Image

        with Image.open(io.BytesIO(data)) as img:
            rgb = img.convert("RGB")
        if not self.on_gpu:
            return self.preset(rgb)
        hwc = torch.from_numpy(np.array(rgb)).to(self.device, non_blocking=True)  # a writable copy for torch
        return self.preset(hwc.permute(2, 0, 1))

    def __call__(self, batch: list[bytes]) -> torch.Tensor:
        images = [self.one(batch[0])] if len(batch) == 1 else list(self.pool.map(self.one, batch))
        return torch.stack(images).to(self.device, non_blocking=True)


class Row:
    """One way to serve: ``preprocess(list of bytes) -> NCHW float batch on the device``; ``top5`` adds the model."""

    def __init__(self, name: str, kind: str, preprocess, model, device: torch.device) -> None:
        self.name, self.kind, self.preprocess, self.model, self.device = name, kind, preprocess, model, device
        self.result: dict = {"name": name, "kind": kind}

    @torch.inference_mode()
    def top5(self, batch: list[bytes]) -> torch.Tensor:
        return torch.softmax(self.model(self.preprocess(batch)), dim=1).topk(5, dim=1).indices.cpu()

    def preprocess_synced(self, batch: list[bytes]) -> None:
        self.preprocess(batch)
        sync(self.device)


def _time_calls(fn, batches: list[list[bytes]]) -> list[float]:
    times = []
    for batch in batches:
        t0 = time.perf_counter()
        fn(batch)
        times.append(time.perf_counter() - t0)
    return times


def _ms(times: list[float]) -> dict:
    ordered = sorted(times)
    return {"median_ms": 1000 * statistics.median(ordered), "p90_ms": 1000 * ordered[int(0.9 * (len(ordered) - 1))]}


def _requests(images: list[bytes], size: int, count: int, offset: int = 0) -> list[list[bytes]]:
    """``count`` runs of ``size`` images, cycling through the set."""
    return [[images[(offset + i * size + j) % len(images)] for j in range(size)] for i in range(count)]


def _cold_start_child(args: argparse.Namespace) -> None:
    """In a fresh process: a new Predictor of ``--cold-start`` engine to its first top-5 of ``--image``."""
    import nvidia.dali  # noqa: F401 - DALI's base module: both engines need it, neither is timed for it
    import torchvision

    from crossdali.pytorch.predict import Predictor

    gpu = torch.cuda.is_available() and not args.cpu
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    model = torchvision.models.get_model(args.arch, weights=None, num_classes=1000).to(device).eval()
    with torch.inference_mode():
        model(torch.zeros(1, 3, args.crop_size, args.crop_size, device=device)).cpu()  # CUDA and cuDNN up
    data = args.image.read_bytes()
    t0 = time.perf_counter()
    predictor = Predictor(model, crop_size=args.crop_size, class_names=[str(i) for i in range(1000)], device=device,
                          max_batch_size=args.batch_size, workers=args.workers, engine=args.cold_start)
    first = predictor.predict([data], topk=5)
    t1 = time.perf_counter()
    predictor.predict([data], topk=5)
    t2 = time.perf_counter()
    assert len(first[0].top) == 5
    print(json.dumps({"engine": args.cold_start, "first_s": t1 - t0, "second_s": t2 - t1}))


def _cold_starts(args: argparse.Namespace, image: Path, gpu: bool) -> dict:
    runs: dict[str, list[dict]] = {e: [] for e in (("pipeline",) if gpu else ENGINE_ROWS)}  # eager: CPU only
    base = [sys.executable, "-m", "benchmarks.predict_latency", "--image", str(image), "--arch", args.arch,
            "--crop-size", str(args.crop_size), "-b", str(args.batch_size), "--workers", str(args.workers)]
    for _ in range(args.cold_starts):
        for engine in runs:  # interleaved
            proc = subprocess.run([*base, "--cold-start", engine, *([] if gpu else ["--cpu"])],
                                  capture_output=True, text=True, timeout=300)
            if proc.returncode != 0:
                return {"error": f"{engine}: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}"}
            runs[engine].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return {engine: {"first_ms": 1000 * statistics.median(r["first_s"] for r in rs),
                     "second_ms": 1000 * statistics.median(r["second_s"] for r in rs),
                     "runs_first_ms": [1000 * r["first_s"] for r in rs]} for engine, rs in runs.items()}


def eager_max_images(sweep: list[dict]) -> int:
    """The largest run size up to which eager's median was never above the pipeline's (0: slower at 1)."""
    best = 0
    for point in sorted(sweep, key=lambda p: p["images"]):
        if point["eager_ms"] > point["pipeline_ms"]:
            break
        best = point["images"]
    return best


def plot(report: dict, png: Path) -> bool:
    """Per image, per batch and the crossover; ``False`` where matplotlib is not installed."""
    plt = pyplot()
    if plt is None:
        return False
    rows = [r for r in report["results"] if "per_image" in r and "per_batch" in r]
    if not rows:
        return False
    fig, axes = plt.subplots(1, 3, figsize=(19, 1.9 + 0.55 * len(rows)), layout="constrained")
    names = [r["name"] for r in rows]
    colors = [EAGER_COLOR if r["kind"] == "eager" else backend_color(report["backend"] if r["kind"] == "pipeline" else "")
              for r in rows]
    per_image = [r["per_image"]["median_ms"] for r in rows]
    bars(axes[0], names, per_image, colors=colors, headroom=1.8,
         labels=[f"{r['per_image']['median_ms']:.2f} ms (preprocess {r['per_image']['preprocess_ms']:.2f})"
                 for r in rows],
         xlabel="median ms, one image: bytes -> top-5 (lower is better)", title=f"per image, {report['model']}")
    bars(axes[1], names, [r["per_batch"]["median_ms"] for r in rows], colors=colors, headroom=1.8,
         labels=[f"{r['per_batch']['median_ms']:.1f} ms = {r['per_batch']['img_s']:,.0f} img/s" for r in rows],
         xlabel=f"median ms per batch of {report['batch_size']} (lower is better)",
         title=f"{report['gpu'] or report['cpu']}, {report['cpu_count']} CPU cores")
    for engine in ENGINE_ROWS:
        points = [p for p in report["crossover"] if f"{engine}_ms" in p]
        axes[2].plot([p["images"] for p in points], [p[f"{engine}_ms"] / p["images"] for p in points], marker="o",
                     label=engine, color=EAGER_COLOR if engine == "eager" else backend_color(report["backend"]))
    axes[2].set_xscale("log", base=2)
    axes[2].set_xlabel("images per run")
    axes[2].set_ylabel("preprocessing ms per image (median)")
    axes[2].set_title(f"crossover: eager no slower up to {report.get('eager_max_images')} images")
    axes[2].legend()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


def main(args: argparse.Namespace) -> dict:
    if args.cold_start:
        _cold_start_child(args)
        return {}
    import torchvision

    from crossdali.common.data.sample_data import ensure_classification
    from crossdali.common.data.sources import resolve_source
    from crossdali.common.inference import EAGER_MAX_IMAGES, EAGER_STARTS_FASTER
    from crossdali.pytorch.predict import Predictor

    if args.smoke:
        args.size, args.arch, args.crop_size, args.workers, args.cpu = "tiny", "resnet18", 64, 2, True
        args.requests, args.batches, args.rounds, args.warmup, args.batch_size = 4, 1, 1, 1, 8
        args.sweep, args.sweep_runs, args.cold_starts = "1,8", 2, 1
    elif not args.cpu and not torch.cuda.is_available():
        raise usage_error("no CUDA GPU here: pass --cpu for the CPU rows alone (or --smoke)")
    sweep = [int(n) for n in args.sweep.split(",")]
    if min(args.requests, args.batches, args.rounds, args.sweep_runs, args.workers, *sweep) < 1 or args.cold_starts < 0:
        raise usage_error("--requests, --batches, --rounds, --sweep-runs, --workers and the --sweep sizes must be at "
                          "least 1, --cold-starts at least 0")
    gpu = not args.cpu
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.in_child:
        return _run_in_children(args, args.out / f"{'predict_latency' if gpu else 'predict_latency_cpu'}.json")
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    torch.backends.cudnn.benchmark = gpu
    files = resolve_source(ensure_classification(args.data_root, size=args.size, formats=("imagefolder",))
                           / "imagefolder", "val").files
    images = [Path(f).read_bytes() for f in files]
    model = torchvision.models.get_model(args.arch, weights=None, num_classes=1000).to(device).eval()
    names = [str(i) for i in range(1000)]
    where = "GPU" if gpu else "CPU"

    def predictor(engine: str) -> Predictor:
        return Predictor(model, crop_size=args.crop_size, class_names=names, device=device,
                         max_batch_size=max(args.batch_size, *sweep), workers=args.workers, engine=engine)

    def dali(p: Predictor):
        from crossdali.common.inference import prepare_image

        return lambda batch: p.preprocess([prepare_image(b, name="request") for b in batch])

    skip = set(filter(None, args.skip.split(",")))
    # each engine is made on its first run; eager is CPU-only (a UsageError on the GPU)
    eager, pipeline = None if gpu else predictor("eager"), predictor("pipeline")
    rows = [*([] if gpu else [Row(f"DALI eager ({where}, {args.workers} threads)", "eager", dali(eager), model, device)]),
            Row(f"DALI pipeline ({where}, {args.workers} threads)", "pipeline", dali(pipeline), model, device),
            Row("PIL + torchvision transforms", "pil", PILPreprocess(args.crop_size, args.workers, device, on_gpu=False),
                model, device)]
    if gpu:
        rows.append(Row("PIL + torchvision transforms on the GPU", "pil-gpu",
                        PILPreprocess(args.crop_size, args.workers, device, on_gpu=True), model, device))
    rows = [r for r in rows if r.kind not in skip]
    report = {
        **environment("predict_latency", device),
        "gpu": gpu_name() if gpu else None,
        "cpu": cpu_model(),
        "backend": "dali-gpu" if gpu else "dali-cpu",
        "model": f"{args.arch} {args.crop_size} px, float32",
        "size": args.size,
        "dataset": {"images": len(images), "jpeg_mean_kib": sum(map(len, images)) / len(images) / 1024},
        "batch_size": args.batch_size,
        "workers": args.workers,
        "rounds": args.rounds,
        "eager_max_images_in_code": EAGER_MAX_IMAGES["gpu" if gpu else "cpu"],
        "eager_starts_faster_in_code": EAGER_STARTS_FASTER["gpu" if gpu else "cpu"],
        "timing": f"{args.rounds} interleaved rounds; per round and row {args.requests} one-image requests and "
                  f"{args.batches} batches of {args.batch_size}; medians over all rounds",
        "results": [row.result for row in rows],
        "crossover": [],
    }
    stem = "predict_latency" if gpu else "predict_latency_cpu"
    path = args.out / f"{stem}.json"

    def save() -> None:
        path.write_text(json.dumps(report, indent=2) + "\n")

    live = []
    for row in rows:  # warm-up: engines built, operators made, allocators and cuDNN settled
        _mark(args, row.kind)
        try:
            for batch in _requests(images, 1, args.warmup) + _requests(images, args.batch_size, max(1, args.warmup // 2)):
                row.top5(batch)
            live.append(row)
        except Exception as e:  # noqa: BLE001 - an unattended run records the failure and goes on
            row.result["error"] = f"{type(e).__name__}: {e}"
            print(f"{row.name}: FAILED {row.result['error']}", flush=True)
    times: dict[str, dict[str, list[float]]] = {r.name: {"image": [], "image_pre": [], "batch": [], "batch_pre": []}
                                                for r in live}
    by_round: dict[str, list[float]] = {r.name: [] for r in live}
    for rnd in range(args.rounds):
        for row in live:
            _mark(args, row.kind)
            t = times[row.name]
            one = _requests(images, 1, args.requests, offset=rnd * args.requests)
            many = _requests(images, args.batch_size, args.batches, offset=rnd)
            got = _time_calls(row.top5, one)
            t["image"] += got
            by_round[row.name].append(statistics.median(got))
            t["image_pre"] += _time_calls(row.preprocess_synced, one)
            t["batch"] += _time_calls(row.top5, many)
            t["batch_pre"] += _time_calls(row.preprocess_synced, many)
            row.result["per_image"] = {**_ms(t["image"]), "preprocess_ms": _ms(t["image_pre"])["median_ms"],
                                       "requests": len(t["image"])}
            row.result["per_batch"] = {**_ms(t["batch"]), "preprocess_ms": _ms(t["batch_pre"])["median_ms"],
                                       "img_s": 1000 * args.batch_size / _ms(t["batch"])["median_ms"],
                                       "batches": len(t["batch"])}
        print(f"round {rnd + 1}/{args.rounds}: " + ", ".join(
            f"{r.kind} {r.result['per_image']['median_ms']:.2f} ms/img, {r.result['per_batch']['median_ms']:.1f} "
            f"ms/batch" for r in live), flush=True)
        save()
    base = next((r for r in live if r.kind == "pipeline"), None)
    if base is not None:
        report["per_image_over_pipeline"] = {r.name: round_spread([a / b for a, b in zip(by_round[r.name],
                                                                                      by_round[base.name])])
                                             for r in live if r is not base}

    engine_rows = [r for r in live if r.kind in ENGINE_ROWS]
    if len(engine_rows) == 2:
        sweep_times = {(r.kind, n): [] for r in engine_rows for n in sweep}
        for rnd in range(args.rounds):
            for n in sweep:
                for row in engine_rows:
                    _mark(args, row.kind)
                    runs = _requests(images, n, args.sweep_runs, offset=rnd)
                    row.preprocess_synced(runs[0])  # a new run size: DALI sizes its operators' buffers
                    sweep_times[row.kind, n] += _time_calls(row.preprocess_synced, runs)
        report["crossover"] = [{"images": n, **{f"{k}_ms": 1000 * statistics.median(sweep_times[k, n])
                                                for k in ENGINE_ROWS}} for n in sweep]
        report["eager_max_images"] = eager_max_images(report["crossover"])
        print("crossover (preprocessing ms): " + ", ".join(
            f"{p['images']}: eager {p['eager_ms']:.2f} / pipeline {p['pipeline_ms']:.2f}" for p in report["crossover"])
            + f" -> eager no slower up to {report['eager_max_images']} images", flush=True)
        save()
    del eager, pipeline, rows, live
    if args.cold_starts and "cold-start" not in skip:
        _mark(args, "cold-start")
        report["cold_start"] = cold = _cold_starts(args, Path(files[0]), gpu)
        if "eager" in cold:  # the value for EAGER_STARTS_FASTER on this device
            report["eager_starts_faster"] = cold["eager"]["first_ms"] < cold["pipeline"]["first_ms"]
        print(f"cold start (new Predictor to its first top-5): {report['cold_start']}", flush=True)
        save()
    if plot(report, args.out / f"{stem}.png"):
        print(f"wrote {path} and {path.with_suffix('.png')}")
    else:
        print(f"wrote {path} (no matplotlib here: no plot)")
    return report


if __name__ == "__main__":
    main(get_args_parser().parse_args())
