"""SSD300 training input pipeline, images/s: DALI GPU vs DALI CPU vs the torchvision v2 DataLoader
(docs/benchmarks.md#detection-loaders).

    python -m benchmarks.detection_loaders                         # on a GPU machine (minutes): results/latest
    python -m benchmarks.detection_loaders --out /tmp/b --smoke    # check the script on a CPU machine
    python -m benchmarks.detection_loaders --cpu --workers 2       # DALI CPU vs torchvision on this CPU only
    python -m crossdali.common.plugins build; python -m benchmarks.detection_loaders --fused-colour  # + fused rows

The same COCO-format JPEGs for every loader (the ``bench`` detection sample set: 4,096 train
images of about 70 KB, built here from scikit-image's photos; no pycocotools needed). The
transform is crossdali's SSD300 train transform: zoom-out paste (+ box paste), IoU crop, resize
300, flip (+ box flip), colour jitter, normalize, and the 8,732-anchor box encoding; batch 64;
15 threads / workers. Batches are moved to the GPU. Each loader warms up for a few batches (worker
start, allocator), then is timed for ``--seconds`` of steady state. Every loader runs in a
try-block and the JSON is rewritten after each one, so a failure or a time-out leaves the
results so far. Writes ``detection_loaders.json`` and ``detection_loaders.png``.

``--cpu`` measures the two CPU loaders only (no GPU needed; batches stay on the CPU) and alternates
them for ``--rounds`` rounds of ``--seconds`` each, so that other load on a shared machine hits both
alike; each loader's images/s is its median round, and every round is recorded. It writes
``detection_loaders_cpu.json`` so it never replaces the GPU run's results.

DALI GPU runs at the first ``--hw-loads`` value with the loader's defaults (the row of the three-way comparison:
2 pipelines per shard, ``default_detection_pipelines``), then as extras: with each other ``--pipelines`` count
(merged into each batch; ``--workers`` threads each), with the zoom-out canvas (``--gpu-canvas``:
``DetectionTransform(canvas_free=False)``, one row per count), with the fused colour operator (``--fused-colour``:
``DetectionTransform(fused_colour=True)``, one row per count; the plugin must be built, ``python -m
crossdali.common.plugins build``, else the rows record the error), and at the other ``--hw-loads`` values. A row's
name gives its pipelines where they are not the default; every row records its ``pipelines``, ``canvas_free`` and
``fused_colour``.

Engine load: on a GPU machine every row timed there carries ``engine_load``, the mean (and max) percent of the
GPU's SMs, NVDEC, NVJPG, ... from ``nvidia-smi dmon`` over its timed window (``benchmarks/engine_load.py``),
printed beside its images/s; the raw dmon lines go to ``detection_loaders_dmon.log``. Without nvidia-smi (CPU,
``--smoke`` there, ``--cpu``) no row has it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

from benchmarks import cpu_model, usage_error
from benchmarks.engine_load import EngineLoad
from benchmarks.plot import backend_color, bar_png
from crossdali.common.data.sample_data.detection import ensure_detection
from crossdali.common.detection import DetectionTransform, default_detection_pipelines, resolve_detection_source
from crossdali.pytorch.detection import create_detection_loader

NATIVE = "torchvision v2 DataLoader (native)"


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, add_help=add_help,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results/latest"), help="folder for the JSON and PNG")
    parser.add_argument("--data-root", type=Path, default=None,
                        help="where to build the sample set (default: $CROSSDALI_DATA or ~/.cache/crossdali; never --out)")
    parser.add_argument("--size", default="bench", help="detection sample set size (bench: 4,096 train JPEGs)")
    parser.add_argument("-b", "--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=15, help="DALI threads / DataLoader workers")
    parser.add_argument("--seconds", type=float, default=20.0, help="timed steady state per loader")
    parser.add_argument("--warmup-batches", type=int, default=5)
    parser.add_argument("--hw-loads", default="1.0,0", help="hw_decoder_load values for DALI GPU")
    parser.add_argument("--pipelines", default="1,2",
                        help="DALI GPU pipelines per shard, one row each at the first --hw-loads value")
    parser.add_argument("--gpu-canvas", action=argparse.BooleanOptionalAction, default=True,
                        help="DALI GPU rows that build the zoom-out canvas (the default does not), one per --pipelines "
                             "count")
    parser.add_argument("--fused-colour", action=argparse.BooleanOptionalAction, default=False,
                        help="DALI GPU rows with the fused colour operator, one per --pipelines count (build the "
                             "plugin first: python -m crossdali.common.plugins build)")
    parser.add_argument("--budget-s", type=float, default=330.0, help="skip loaders once this much time has passed")
    parser.add_argument("--smoke", action="store_true", help="CPU-only check: tiny set, 2 workers, short timing")
    parser.add_argument("--cpu", action="store_true",
                        help="DALI CPU vs the torchvision DataLoader only, alternating for --rounds rounds")
    parser.add_argument("--rounds", type=int, default=5, help="with --cpu: rounds of --seconds per loader")
    return parser


def _gpu_configs(args: argparse.Namespace) -> list[tuple[str, dict]]:
    """The DALI GPU rows: the first ``--hw-loads`` value (the three-way comparison's row), then the same
    with each further ``--pipelines`` count, the zoom-out canvas and the fused colour operator (each at
    every ``--pipelines`` count), then the other hw loads."""
    try:
        loads = [float(h) for h in args.hw_loads.split(",") if h]
        counts = [int(p) for p in args.pipelines.split(",") if p]
    except ValueError as e:
        raise usage_error(f"--hw-loads {args.hw_loads!r} / --pipelines {args.pipelines!r}: comma lists of numbers "
                          f"({e})") from e
    if not loads:
        raise usage_error("--hw-loads needs at least one value, e.g. --hw-loads 1.0")
    if any(p < 1 or args.batch_size % p for p in counts):
        raise usage_error(f"--pipelines {args.pipelines!r}: each count must be positive and divide --batch-size "
                          f"{args.batch_size}")
    first = f"DALI GPU hw_decoder_load={loads[0]:g}"
    default = default_detection_pipelines("dali-gpu", args.batch_size, train=True)

    def count(p: int) -> str:  # the name says the pipelines where they are not the loader's default
        return "" if p == default else f", {p} pipeline{'s' if p > 1 else ''}"

    rows = [(first, dict(backend="dali-gpu", hw_decoder_load=loads[0]))]
    rows += [(first + count(p), dict(backend="dali-gpu", hw_decoder_load=loads[0], pipelines=p))
             for p in dict.fromkeys(counts) if p != default]
    if args.gpu_canvas:
        canvas = DetectionTransform(canvas_free=False)
        rows += [(f"{first}, with the canvas" + count(p),
                  dict(backend="dali-gpu", hw_decoder_load=loads[0], transform=canvas, pipelines=p))
                 for p in dict.fromkeys([default, *counts])]
    if args.fused_colour:
        fused = DetectionTransform(fused_colour=True)
        rows += [(f"{first}, fused colour" + count(p),
                  dict(backend="dali-gpu", hw_decoder_load=loads[0], transform=fused, pipelines=p))
                 for p in dict.fromkeys([default, *counts])]
    return rows + [(f"DALI GPU hw_decoder_load={h:g}", dict(backend="dali-gpu", hw_decoder_load=h)) for h in loads[1:]]


def _row(name: str, cfg: dict, batch_size: int) -> dict:
    """A result row's settings: backend, decoder share, pipelines per shard (the loader's default where the row
    gives none, ``default_detection_pipelines``), whether the zoom-out ran
    without the canvas (the default, ``DetectionTransform.canvas_free``) and whether the
    colour jitter + normalisation ran as the plugin's one operator (both None for native)."""
    transform = cfg.get("transform")
    canvas_free = None if cfg["backend"] == "native" else (transform or DetectionTransform()).canvas_free
    fused_colour = None if cfg["backend"] == "native" else transform is not None and transform.fused_colour
    return {"name": name, "backend": cfg["backend"], "hw_decoder_load": cfg.get("hw_decoder_load"),
            "pipelines": cfg.get("pipelines") or default_detection_pipelines(cfg["backend"], batch_size, train=True),
            "canvas_free": canvas_free, "fused_colour": fused_colour}


def _forever(loader):
    while True:
        yield from loader


def _measure(loader, device: torch.device, *, seconds: float, warmup: int, it=None,
             load: EngineLoad | None = None) -> dict:
    """Warm up, then count images for ``seconds`` (at least 3 batches), crossing epochs if needed.
    ``it``: an iterator over ``loader``'s batches to go on with (``_forever(loader)``); ``load``: running
    dmon, whose means over the timed window become ``engine_load``."""
    it = it if it is not None else _forever(loader)
    for _ in range(warmup):
        next(it)
    _sync(device)
    n, steps, start = 0, 0, time.perf_counter()
    while steps < 3 or time.perf_counter() - start < seconds:
        images, offsets, labels = next(it)
        images = images.to(device, non_blocking=True)
        offsets = offsets.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        n, steps = n + images.shape[0], steps + 1
    _sync(device)
    end = time.perf_counter()
    elapsed = end - start
    assert images.shape[1:] == (3, 300, 300) and offsets.shape[1:] == (8732, 4), (images.shape, offsets.shape)
    out = {"images": n, "batches": steps, "seconds": elapsed, "img_s": n / elapsed,
           "positive_anchors_per_image": float((labels > 0).sum()) / images.shape[0]}
    if load is not None and load.available:
        out["engine_load"] = load.mean(start, end)
    return out


def _engine_text(load: dict | None) -> str:
    """The console's share of a row's engine load: SMs, NVDEC and NVJPG means, when dmon ran."""
    if not load:
        return ""
    return "".join(f"  {name} {load[name]:.0f} %" for name in ("sm", "dec", "jpg") if name in load)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plot(report: dict, png: Path) -> None:
    """Horizontal bars with matplotlib, or Pillow where matplotlib is not installed."""
    rows = [r for r in report["loader"] if "img_s" in r]
    if not rows:
        return
    names, values = [r["name"] for r in rows], [r["img_s"] for r in rows]
    title = (f"SSD300 train input pipeline, batch {report['batch_size']}, {report['workers']} threads/workers\n"
             f"{report['device']}, {report['cpu_count']} cores, {report['dataset']['images']:,} JPEGs "
             f"of {report['dataset']['mean_kib']:.0f} KiB")
    colors = [backend_color(r["backend"]) for r in rows]
    if bar_png(png, names, values, labels=[f"{v:,.0f}" for v in values], colors=colors, log=True, headroom=4,
               xlabel="images/s (log scale, higher is better)", title=title) is None:
        _plot_pil(names, values, title, png)


def _plot_pil(names: list[str], values: list[float], title: str, png: Path) -> None:
    """The same chart drawn with Pillow (the GPU machine has no matplotlib)."""
    from PIL import Image, ImageDraw

    w, row, left = 1100, 44, 380
    img = Image.new("RGB", (w, 70 + row * len(names)), "white")
    draw = ImageDraw.Draw(img)
    draw.multiline_text((10, 8), title, fill="black")
    top = max(values)
    for i, (name, v) in enumerate(zip(names, values)):
        y = 60 + row * i
        length = max(1, int((w - left - 140) * v / top))
        color = (118, 185, 0) if name.startswith("DALI GPU") else (90, 125, 154) if name.startswith("DALI") else (153,) * 3
        draw.rectangle([left, y, left + length, y + row - 12], fill=color)
        draw.text((10, y + 10), name[:60], fill="black")
        draw.text((left + length + 8, y + 10), f"{v:,.0f} img/s", fill="black")
    img.save(png)


def main(args: argparse.Namespace) -> dict:
    t_start = time.perf_counter()
    if args.smoke:
        args.size, args.workers, args.seconds, args.warmup_batches, args.batch_size = "tiny", 2, 2.0, 1, 16
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke and not args.cpu:
        raise usage_error("this benchmark compares GPU-fed pipelines: run it on a machine with a CUDA GPU "
                          "(or --cpu for the CPU loaders alone, or --smoke)")
    if args.rounds < 1:
        raise usage_error(f"--rounds must be at least 1, got {args.rounds}")
    device = torch.device("cuda", 0) if cuda and not args.cpu else torch.device("cpu")
    args.out.mkdir(parents=True, exist_ok=True)
    root = ensure_detection(args.data_root, args.size)
    source = resolve_detection_source(root, "train")
    files = sorted(source.file_root.glob("*.jpg"))
    mean_kib = sum(f.stat().st_size for f in files) / max(1, len(files)) / 1024
    print(f"data: {source.num_images} JPEGs, mean {mean_kib:.0f} KiB (built/checked in "
          f"{time.perf_counter() - t_start:.0f} s)", flush=True)

    gpu_configs = _gpu_configs(args)  # checked on every machine, so --smoke catches a mistyped list
    if not cuda or args.cpu:
        gpu_configs = []
    # the three-way comparison first, so that a spent time budget only skips the extra GPU variants
    configs = [*gpu_configs[:1], ("DALI CPU", dict(backend="dali-cpu")), (NATIVE, dict(backend="native")),
               *gpu_configs[1:]]
    if args.cpu:  # the default (no zoomed-out canvas) beside the canvas
        configs.append(("DALI CPU, with the canvas", dict(backend="dali-cpu",
                                                          transform=DetectionTransform(canvas_free=False))))
    report = {
        "benchmark": "detection_loaders",
        "command": " ".join(["python", "-m", "benchmarks.detection_loaders", *sys.argv[1:]]),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "dali": __import__("nvidia.dali").dali.__version__,
        "dataset": {"images": source.num_images, "mean_kib": mean_kib, "size": args.size},
        "batch_size": args.batch_size,
        "workers": args.workers,
        "seconds_per_loader": args.seconds,
        "transform": "zoom-out paste + bbox paste, IoU crop, resize 300, flip + bbox flip, colour jitter, normalize, "
                     "8732-anchor box encoding; " + ("batches stay on the CPU" if device.type == "cpu" else
                                                     "batches moved to the GPU"),
        "loader": [],
    }
    stem = "detection_loaders_cpu" if args.cpu else "detection_loaders"
    json_path, png_path = args.out / f"{stem}.json", args.out / f"{stem}.png"
    if args.cpu:
        report["rounds"] = args.rounds
        _measure_alternating(configs, source, args, device, report, json_path)
        configs = []
    # dmon only where the batches go to the GPU; without nvidia-smi EngineLoad starts nothing
    with EngineLoad(log=args.out / f"{stem}_dmon.log") if device.type == "cuda" else contextlib.nullcontext() as load:
        if load is not None and load.available:
            report["engine_load"] = "mean nvidia-smi dmon -s u percentages over each row's timed window (1 s samples)"
        _measure_rows(configs, source, args, device, report, json_path, t_start, load)
    _finish(report, json_path)
    try:
        plot(report, png_path)
        print(f"wrote {json_path} and {png_path}")
    except Exception:  # noqa: BLE001 - the JSON is what matters
        traceback.print_exc()
    return report


def _measure_rows(configs, source, args, device, report: dict, json_path: Path, t_start: float,
                  load: EngineLoad | None) -> None:
    """Each loader in turn, warmed up and timed once; a failure is recorded in its row and the next runs."""
    for name, cfg in configs:
        if time.perf_counter() - t_start > args.budget_s:
            report["loader"].append(_row(name, cfg, args.batch_size) | {"skipped": "time budget spent"})
            print(f"{name:56s} skipped (time budget)", flush=True)
            continue
        row = _row(name, cfg, args.batch_size)
        try:
            loader = create_detection_loader(source, train=True, batch_size=args.batch_size, workers=args.workers,
                                              device_id=0, **cfg)
            row |= _measure(loader, device, seconds=args.seconds, warmup=args.warmup_batches, load=load)
            print(f"{name:56s} {row['img_s']:9,.0f} img/s{_engine_text(row.get('engine_load'))}", flush=True)
            del loader
        except Exception as e:  # noqa: BLE001 - a benchmark run is unattended: record and go on
            row["error"] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
            print(f"{name:56s} FAILED: {row['error'].splitlines()[0]}", flush=True)
        report["loader"].append(row)
        _finish(report, json_path)


def _measure_alternating(configs, source, args, device, report: dict, json_path: Path) -> None:
    """All loaders built first, then timed in turn for ``args.rounds`` rounds; images/s = median round."""
    rows, its = [], []
    for name, cfg in configs:
        loader = create_detection_loader(source, train=True, batch_size=args.batch_size, workers=args.workers,
                                          device_id=0, **cfg)
        it = _forever(loader)
        for _ in range(args.warmup_batches):
            next(it)
        rows.append(_row(name, cfg, args.batch_size) | {"rounds_img_s": []})
        its.append((loader, it))
    for r in range(args.rounds):
        for row, (loader, it) in zip(rows, its):
            # 2 batches first: what the loader prepared while the other one ran is not counted
            got = _measure(loader, device, seconds=args.seconds, warmup=2, it=it)
            row["rounds_img_s"].append(got["img_s"])
            row |= {k: v for k, v in got.items() if k != "img_s"} | {"img_s": statistics.median(row["rounds_img_s"])}
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{row['name']} {row['rounds_img_s'][-1]:,.0f}"
                                                          for row in rows) + " img/s", flush=True)
        report["loader"] = rows
        _finish(report, json_path)
    if NATIVE in (row["name"] for row in rows):
        native = rows[[row["name"] for row in rows].index(NATIVE)]["rounds_img_s"]
        report["per_round_over_native"] = {row["name"]: [a / b for a, b in zip(row["rounds_img_s"], native)]
                                           for row in rows if row["name"] != NATIVE}


def _finish(report: dict, path: Path) -> None:
    by_name = {r["name"]: r["img_s"] for r in report["loader"] if "img_s" in r}
    if NATIVE in by_name:
        report["speedup_vs_native"] = {k: v / by_name[NATIVE] for k, v in by_name.items()}
    gpu = max((v for k, v in by_name.items() if k.startswith("DALI GPU")), default=None)
    if gpu is not None:  # the project's targets: >= 10,000 img/s and >= 40x the DataLoader in the same run
        report["targets"] = {"dali_gpu_img_s": gpu, "at_least_10000_img_s": gpu >= 10_000}
        if NATIVE in by_name:
            report["targets"] |= {"dali_gpu_over_native": gpu / by_name[NATIVE],
                                  "at_least_40x_native": gpu >= 40 * by_name[NATIVE]}
    path.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main(get_args_parser().parse_args())
