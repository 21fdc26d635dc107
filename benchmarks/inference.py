"""Inference latency (batch 1) and throughput (batch 64) of one model fed by crossdali's DALI
inference pipeline (``crossdali.pytorch.predict.Predictor``) and by PIL + torchvision transforms.

    python -m benchmarks.inference                              # on a GPU machine: ResNet-50, 224 px (results/latest)
    python -m benchmarks.inference --smoke --out /tmp/inf       # tiny CPU run (CI): ResNet-18, 64 px

Images: the ``bench`` sample set's val JPEGs, read into memory once (the benchmark measures
decode + val transform + model, not the disk). The model has random weights (speed does not
depend on them), float32, eval mode, ``torch.inference_mode``; on the GPU channels-last with
cuDNN autotuning, and the same model object for every row.

- latency: one image per request, one after the other; median and 90th percentile of the time
  from encoded bytes to the top-5 classes on the host (``--requests`` requests after ``--warmup``).
- throughput: batches of ``--batch-size`` (64) from bytes to top-5, images/s over ``--batches``
  batches after ``--warmup``; also the preprocessing alone (images/s of model-ready tensors).

PIL rows decode and transform in the calling thread (what a simple server does); the throughput
table adds PIL in a thread pool of ``--workers`` threads. Writes ``inference.json`` and
``inference.png``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from benchmarks.plot import backend_color, bars, pyplot
from crossdali.common.data.sample_data import ensure_classification
from crossdali.common.data.sources import resolve_source


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, add_help=add_help,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results/latest"), help="folder for the JSON and the PNG")
    parser.add_argument("--data-root", type=Path, default=None, help="where to build the sample set")
    parser.add_argument("--size", default="bench", help="sample set size (its val split is read)")
    parser.add_argument("--arch", default="resnet50")
    parser.add_argument("--crop-size", type=int, default=224)
    parser.add_argument("-b", "--batch-size", type=int, default=64)
    parser.add_argument("--requests", type=int, default=200, help="timed batch-1 requests per row")
    parser.add_argument("--batches", type=int, default=20, help="timed batches per throughput row")
    parser.add_argument("--workers", type=int, default=8, help="DALI threads / PIL pool threads")
    parser.add_argument("--warmup", type=int, default=10, help="untimed requests (latency) / batches (throughput)")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even where a GPU is visible")
    parser.add_argument("--smoke", action="store_true", help="tiny set, CPU, ResNet-18 at 64 px: checks the script runs")
    return parser


class PILPreprocess:
    """PIL decode + torchvision's eval preset (resize, centre crop, normalize): the baseline."""

    def __init__(self, crop: int, workers: int) -> None:
        from crossdali.common.classification import ClassificationTransform
        from crossdali.pytorch.presets import ClassificationPresetEval

        self.preset = ClassificationPresetEval(transform=ClassificationTransform(crop_size=crop))
        self.pool = ThreadPoolExecutor(workers) if workers > 1 else None

    def one(self, data: bytes) -> torch.Tensor:
        from PIL import Image

        with Image.open(io.BytesIO(data)) as img:
            return self.preset(img.convert("RGB"))

    def __call__(self, batch: list[bytes], device: torch.device) -> torch.Tensor:
        images = list(self.pool.map(self.one, batch)) if self.pool is not None else [self.one(b) for b in batch]
        return torch.stack(images).to(device, non_blocking=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def _classify(model, images: torch.Tensor, device: torch.device):
    if device.type == "cuda":
        images = images.contiguous(memory_format=torch.channels_last)
    return torch.softmax(model(images), dim=1).topk(5, dim=1).indices.cpu()


def _latency(preprocess, model, images: list[bytes], device, *, requests: int, warmup: int) -> dict:
    for data in images[:warmup]:
        _classify(model, preprocess([data]), device)
    times = []
    for i in range(requests):
        data = images[i % len(images)]
        t0 = time.perf_counter()
        _classify(model, preprocess([data]), device)  # .cpu() in _classify waits for the GPU
        times.append(time.perf_counter() - t0)
    times.sort()
    return {"requests": requests, "median_ms": 1000 * statistics.median(times),
            "p90_ms": 1000 * times[int(0.9 * (len(times) - 1))], "mean_ms": 1000 * statistics.fmean(times)}


def _throughput(preprocess, model, images: list[bytes], device, *, batch_size: int, batches: int, warmup: int) -> dict:
    def batch(i):
        start = (i * batch_size) % len(images)
        return (images * (batch_size // len(images) + 2))[start:start + batch_size]

    for i in range(warmup):
        _classify(model, preprocess(batch(i)), device)
    _sync(device)
    t0 = time.perf_counter()
    for i in range(batches):
        _classify(model, preprocess(batch(i)), device)
    end_to_end = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(batches):
        preprocess(batch(i))
    _sync(device)
    pre = time.perf_counter() - t0
    n = batches * batch_size
    return {"batches": batches, "batch_size": batch_size, "img_s": n / end_to_end, "preprocess_img_s": n / pre}


def plot(report: dict, png: Path) -> bool:
    """Latency and throughput bars; ``False`` where matplotlib is not installed."""
    plt = pyplot()
    if plt is None:
        return False
    lat = [r for r in report["latency"] if "median_ms" in r]
    thr = [r for r in report["throughput"] if "img_s" in r]
    fig, axes = plt.subplots(1, 2, figsize=(15, 1.6 + 0.55 * max(len(lat), len(thr))), layout="constrained")
    color = lambda name: backend_color("dali-gpu" if "DALI" in name else "")  # noqa: E731
    bars(axes[0], [r["name"] for r in lat], [r["median_ms"] for r in lat], colors=[color(r["name"]) for r in lat],
         labels=[f"{r['median_ms']:.1f} ms (p90 {r['p90_ms']:.1f})" for r in lat],
         headroom=1.6 * max(r["p90_ms"] for r in lat) / max(r["median_ms"] for r in lat),
         xlabel="median ms per image, batch 1 (lower is better)", title=f"latency: bytes -> top-5, {report['model']}")
    bars(axes[1], [r["name"] for r in thr], [r["img_s"] for r in thr], colors=[color(r["name"]) for r in thr],
         labels=[f"{r['img_s']:,.0f} img/s (preprocess {r['preprocess_img_s']:,.0f})" for r in thr], headroom=1.8,
         xlabel=f"images/s, batch {report['batch_size']} (higher is better)",
         title=f"throughput on {report['device']}, {report['cpu_count']} CPU cores")
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


def main(args: argparse.Namespace) -> dict:
    import torchvision

    from crossdali.common.inference import prepare_image
    from crossdali.pytorch.predict import Predictor

    if args.smoke:
        args.size, args.arch, args.crop_size, args.workers = "tiny", "resnet18", 64, 2
        args.requests, args.batches, args.batch_size, args.warmup = 8, 2, 16, 1
    gpu = torch.cuda.is_available() and not (args.smoke or args.cpu)
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    torch.backends.cudnn.benchmark = gpu
    args.out.mkdir(parents=True, exist_ok=True)
    root = ensure_classification(args.data_root, size=args.size, formats=("imagefolder",)) / "imagefolder"
    files = resolve_source(root, "val").files
    images = [Path(f).read_bytes() for f in files]
    model = torchvision.models.get_model(args.arch, weights=None, num_classes=1000).to(device).eval()
    if gpu:
        model = model.to(memory_format=torch.channels_last)
    names = [str(i) for i in range(1000)]

    predictor = Predictor(model, crop_size=args.crop_size, class_names=names, device=device,
                          max_batch_size=args.batch_size, workers=args.workers)

    def dali(batch: list[bytes]) -> torch.Tensor:
        return predictor.preprocess([prepare_image(b, name="request") for b in batch])

    pil_serial = PILPreprocess(args.crop_size, workers=1)
    pil_pool = PILPreprocess(args.crop_size, workers=args.workers)
    where = "GPU" if gpu else "CPU"
    report = {
        "benchmark": "inference",
        "command": " ".join(["python", "-m", "benchmarks.inference", *sys.argv[1:]]),
        "device": torch.cuda.get_device_name(device) if gpu else platform.processor() or "cpu",
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "dali": __import__("nvidia.dali").dali.__version__,
        "model": f"{args.arch} {args.crop_size} px, float32" + (", channels-last" if gpu else ""),
        "dataset": {"images": len(images), "mean_kib": sum(map(len, images)) / len(images) / 1024},
        "batch_size": args.batch_size,
        "workers": args.workers,
        "latency": [],
        "throughput": [],
    }
    path = args.out / "inference.json"
    def pil(baseline: PILPreprocess):
        return lambda batch: baseline(batch, device)

    rows = [("latency", f"DALI {where} pipeline ({args.workers} threads)", dali),
            ("latency", "PIL + torchvision", pil(pil_serial)),
            ("throughput", f"DALI {where} pipeline ({args.workers} threads)", dali),
            ("throughput", "PIL + torchvision", pil(pil_serial)),
            ("throughput", f"PIL + torchvision, {args.workers} threads", pil(pil_pool))]
    for table, name, pre in rows:
        row = {"name": name}
        try:
            if table == "latency":
                row.update(_latency(pre, model, images, device, requests=args.requests, warmup=args.warmup))
                print(f"latency    {name:40s} median {row['median_ms']:7.2f} ms  p90 {row['p90_ms']:7.2f} ms", flush=True)
            else:
                row.update(_throughput(pre, model, images, device, batch_size=args.batch_size, batches=args.batches,
                                       warmup=args.warmup))
                print(f"throughput {name:40s} {row['img_s']:9,.0f} img/s  (preprocess alone "
                      f"{row['preprocess_img_s']:,.0f})", flush=True)
        except Exception as e:  # reported in the JSON
            row["error"] = f"{type(e).__name__}: {e}"
            print(f"{table} {name}: FAILED {row['error']}", flush=True)
        report[table].append(row)
        path.write_text(json.dumps(report, indent=2) + "\n")
    if plot(report, args.out / "inference.png"):
        print(f"wrote {path} and {path.with_suffix('.png')}")
    else:
        print(f"wrote {path} (no matplotlib here: no plot)")
    return report


if __name__ == "__main__":
    main(get_args_parser().parse_args())
