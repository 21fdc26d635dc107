"""Images/s of the same DALI pipeline fed to TensorFlow and to PyTorch, on the same JPEGs, in one process.

    python -m benchmarks.tf_vs_torch                            # GPU machine: TF (GPU build) + torch + both DALI plugins
    python -m benchmarks.tf_vs_torch --smoke --out /tmp/bench   # CPU check: dali-cpu, tiny set, TF (torch if importable)

The RN50 train transform (decode, random-resized crop, flip, normalize) on the ``bench`` sample set
(8,195 JPEGs), batch 256, ``--workers`` DALI threads, hardware JPEG decoder share 1.0. Rows:

- ``tensorflow loader``: iterating ``crossdali.tensorflow``'s ``DALILoader`` (the epoch bookkeeping
  slices the batches where they are: on the GPU for dali-gpu);
- ``tensorflow loader.dataset``: what ``model.fit`` gets (for train on a GPU the DALIDataset itself,
  every batch full, the reader running on across epochs), each batch then placed on the GPU as a
  model step would;
- ``tensorflow loader.epoch_dataset``: the exact epochs as host tf.data ops (padding cut), the same way;
- ``tensorflow raw DALIDataset``: the pipeline's ``DALIDataset`` with no bookkeeping at all (the
  ceiling of the TF path; its epochs include the reader's padding rows);
- ``pytorch loader``: ``crossdali.pytorch``'s ``DALILoader`` (DALI's PyTorch iterator).

Per row: one warm-up epoch, then whole epochs timed until at least 2 epochs and ``--min-seconds``
passed; ``--rounds`` repeats all rows, alternating frameworks, since machines drift. Every row
records the device its batches were on. Writes ``tf_vs_torch.json`` after every row, and at the end
``tf_vs_torch.png`` (where matplotlib is installed; else ``--plot JSON`` draws it later).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path

import tensorflow as tf

from crossdali.tensorflow import enable_memory_growth  # isort: skip (before any other GPU user)

enable_memory_growth()  # before TF, DALI or torch touch the GPU: DALI's decoders need memory beside TF

from benchmarks import usage_error  # noqa: E402
from benchmarks.plot import bar_png  # noqa: E402
from crossdali.common.classification import ClassificationTransform, create_classification_pipeline  # noqa: E402
from crossdali.common.data.sample_data import ensure_classification  # noqa: E402
from crossdali.common.data.sources import resolve_source  # noqa: E402
from crossdali.common.options import pipeline_options  # noqa: E402
from crossdali.tensorflow import create_classification_loader as tf_loader  # noqa: E402
from crossdali.tensorflow.dali_loader import dali_dataset  # noqa: E402


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, add_help=add_help,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results/latest"), help="folder for the JSON")
    parser.add_argument("--data-root", type=Path, default=None, help="where to build the bench sample set")
    parser.add_argument("--size", default="bench", help="sample set size (bench: 8,195 JPEGs)")
    parser.add_argument("-b", "--batch-size", type=int, default=256)
    parser.add_argument("--crop-size", type=int, default=224)
    parser.add_argument("--workers", type=int, default=4, help="DALI CPU threads (docs/benchmarks.md#tensorflow-vs-pytorch)")
    parser.add_argument("--hw-decoder-load", type=float, default=1.0)
    parser.add_argument("--min-seconds", type=float, default=5.0, help="time whole epochs until at least this long")
    parser.add_argument("--rounds", type=int, default=2, help="repeat every row, alternating frameworks")
    parser.add_argument("--smoke", action="store_true",
                        help="check the script on a CPU-only machine: dali-cpu, tiny set, batch 32, crop 64")
    parser.add_argument("--plot", type=Path, default=None, metavar="JSON", help="only draw the PNG of a written JSON")
    return parser


def plot(report: dict, png: Path) -> Path | None:
    """Every row of every round, each framework in its colour, the best rate's share of PyTorch's."""
    rows = [r for r in report["rows"] if "img_s" in r]
    share = report.get("tf_over_torch", {})
    return bar_png(
        png, [f"{r['name']} (round {r['round']})" for r in rows], [r["img_s"] for r in rows], width=10, headroom=1.7,
        colors=["#ff6f00" if r["framework"] == "tensorflow" else "#ee4c2c" for r in rows],
        labels=[f"{r['img_s']:,.0f} img/s on {r['batch_device'].rsplit('/', 1)[-1]}"
                + (f" (best: {100 * share[r['name']]:.0f} % of PyTorch)"
                   if r["name"] in share and r["framework"] != "pytorch" else "") for r in rows],
        xlabel="images/s (higher is better)",
        title=f"the same DALI pipeline ({report['backend']}) into TensorFlow and PyTorch, batch {report['batch_size']}"
              f"\n{report['device']}, {report['threads']} DALI threads, {report['dataset']['images']:,} JPEGs")


def _time_epochs(epoch, *, min_seconds: float) -> dict:
    """``epoch()`` runs one epoch and returns (images, device of the last batch, a tensor to wait
    for). One warm-up epoch, then epochs until >= 2 and >= ``min_seconds``."""
    _, _, last = epoch()
    _wait(last)
    n, epochs, device, start = 0, 0, "", time.perf_counter()
    while epochs < 2 or time.perf_counter() - start < min_seconds:
        images, device, last = epoch()
        _wait(last)
        n, epochs = n + images, epochs + 1
    elapsed = time.perf_counter() - start
    return {"images": n, "epochs": epochs, "seconds": elapsed, "img_s": n / elapsed, "batch_device": device}


def _wait(x) -> None:
    """Block until ``x`` (a TF or torch tensor) is computed: one scalar read back."""
    if tf.is_tensor(x):
        float(tf.reshape(x, [-1])[0])
    else:
        import torch

        if x.is_cuda:
            torch.cuda.synchronize(x.device)


def _tf_loader_epoch(loader):
    def epoch():
        n, images = 0, None
        for images, _labels in loader:
            n += int(images.shape[0])
        return n, images.device, images

    return epoch


def _tf_dataset_epoch(loader, place: str, *, exact: bool = False):
    it = iter(loader.epoch_dataset if exact else loader.dataset)  # one iterator across epochs, as Keras keeps it
    steps = loader.steps_per_epoch

    def epoch():
        n, images, delivered = 0, None, ""
        for _ in range(steps):
            images, labels = next(it)
            delivered = images.device  # where tf.data hands the batch over
            with tf.device(place):  # where a model step needs it
                images, labels = tf.identity(images), tf.identity(labels)
            n += int(images.shape[0])
        return n, delivered, images

    return epoch


def _tf_raw_epoch(source, *, args, backend: str, transform: ClassificationTransform, steps: int):
    options = pipeline_options(backend, batch_size=args.batch_size, workers=args.workers, device_id=0,
                               hw_decoder_load=args.hw_decoder_load)
    shape = (args.batch_size, args.crop_size, args.crop_size, 3)
    ds = dali_dataset(create_classification_pipeline(source, train=True, options=options, transform=transform),
                      batch_size=args.batch_size, output_shapes=(shape, (args.batch_size, 1)),
                      output_dtypes=(tf.float32, tf.int64), device_id=options.pipeline_device_id, check_outputs=False)
    with tf.device("/GPU:0" if backend == "dali-gpu" else "/CPU:0"):
        it = iter(ds)

    def epoch():
        n, images = 0, None
        for _ in range(steps):
            images, _labels = next(it)
            n += int(images.shape[0])
        return n, images.device, images

    return epoch


def _torch_loader_epoch(source, *, args, backend: str):
    from crossdali.pytorch import create_classification_loader as torch_loader

    loader = torch_loader(source, train=True, backend=backend, batch_size=args.batch_size, crop_size=args.crop_size,
                          workers=args.workers, hw_decoder_load=args.hw_decoder_load, device_id=0)

    def epoch():
        n, images = 0, None
        for images, _labels in loader:
            n += int(images.shape[0])
        return n, str(images.device), images

    return epoch


def main(args: argparse.Namespace) -> dict:
    if args.plot is not None:
        report = json.loads(args.plot.read_text())
        print(f"wrote {plot(report, args.plot.with_suffix('.png'))}")
        return report
    on_gpu = bool(tf.config.list_physical_devices("GPU"))
    if args.smoke:
        args.size, args.batch_size, args.crop_size, args.workers, args.min_seconds, args.rounds = "tiny", 32, 64, 2, 0.0, 1
    elif not on_gpu:
        raise usage_error("this benchmark compares GPU-fed pipelines: run it where TensorFlow sees a GPU (or --smoke)")
    backend = "dali-gpu" if on_gpu and not args.smoke else "dali-cpu"
    has_torch = bool(importlib.util.find_spec("torch") and importlib.util.find_spec("nvidia.dali.plugin.pytorch"))
    args.out.mkdir(parents=True, exist_ok=True)
    source = resolve_source(ensure_classification(args.data_root, size=args.size, formats=("imagefolder",))
                            / "imagefolder", "train")
    transform = ClassificationTransform(crop_size=args.crop_size, output_layout="HWC")
    common = dict(train=True, backend=backend, batch_size=args.batch_size, crop_size=args.crop_size,
                  workers=args.workers, hw_decoder_load=args.hw_decoder_load, device_id=0)
    report = {
        "benchmark": "tf_vs_torch",
        "command": " ".join(["python", "-m", "benchmarks.tf_vs_torch", *sys.argv[1:]]),
        "device": tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0]).get(
            "device_name", "GPU") if on_gpu else platform.processor() or "cpu",
        "cpu_count": os.cpu_count(), "python": platform.python_version(), "tensorflow": tf.__version__,
        "torch": __import__("torch").__version__ if has_torch else None,
        "dali": __import__("nvidia.dali").dali.__version__,
        "dataset": {"images": source.num_samples}, "backend": backend, "batch_size": args.batch_size,
        "threads": args.workers, "hw_decoder_load": args.hw_decoder_load,
        "transform": f"decode + random-resized-crop {args.crop_size} + flip + normalize, float",
        "timing": f"1 warm-up epoch, then whole epochs until >= 2 epochs and >= {args.min_seconds:g} s",
        "rows": [],
    }
    path = args.out / "tf_vs_torch.json"
    place = "/GPU:0" if backend == "dali-gpu" else "/CPU:0"
    for rnd in range(args.rounds):
        rows = [("tensorflow loader", lambda: _tf_loader_epoch(tf_loader(source, **common))),
                ("tensorflow loader.dataset", lambda: _tf_dataset_epoch(tf_loader(source, **common), place)),
                ("tensorflow loader.epoch_dataset", lambda: _tf_dataset_epoch(tf_loader(source, **common), place,
                                                                              exact=True)),
                ("tensorflow raw DALIDataset", lambda: _tf_raw_epoch(
                    source, args=args, backend=backend, transform=transform,
                    steps=tf_loader(source, **common).epochs.batches_per_reader_epoch)),
                ("pytorch loader", lambda: _torch_loader_epoch(source, args=args, backend=backend))]
        if rnd % 2:
            rows = rows[-1:] + rows[:-1]  # alternate which framework goes first
        for name, make in rows:
            row = {"name": name, "round": rnd + 1, "framework": name.split()[0]}
            if row["framework"] == "pytorch" and not has_torch:
                row["skipped"] = "torch or DALI's PyTorch plugin is not installed in this environment"
            else:
                try:  # one failing row is recorded with its error; the others still run
                    row.update(_time_epochs(make(), min_seconds=args.min_seconds))
                    print(f"{name:30s} round {rnd + 1}: {row['img_s']:9,.0f} img/s on {row['batch_device']}", flush=True)
                except Exception as e:  # reported in the JSON
                    row["error"] = f"{type(e).__name__}: {e}"
                    print(f"{name:30s} FAILED: {row['error']}", flush=True)
            report["rows"].append(row)
            path.write_text(json.dumps(report, indent=2) + "\n")
    best = {}
    for row in report["rows"]:
        if "img_s" in row:
            best[row["name"]] = max(best.get(row["name"], 0.0), row["img_s"])
    report["best_img_s"] = best
    if "pytorch loader" in best:
        report["tf_over_torch"] = {name: v / best["pytorch loader"] for name, v in best.items()}
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}" + (f" and {png}" if (png := plot(report, path.with_suffix(".png"))) else ""))
    return report


if __name__ == "__main__":
    main(get_args_parser().parse_args())
