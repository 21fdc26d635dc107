"""Images/s of a Squirrel store fed to DALI through ``fn.external_source``, against Squirrel's own
PyTorch path (PIL + torchvision in a DataLoader), both with the RN50 train transform.

    python -m benchmarks.external_source                            # on a GPU machine (DALI GPU rows): results/latest
    python -m benchmarks.external_source --cpu --size small -b 64 --workers 2 --data-root /tmp/d --out /tmp/es
    python -m benchmarks.external_source --smoke --out /tmp/es      # tiny CPU run (CI)

The store is written once from the ``bench`` sample set (8,195 JPEGs cut from real photos, 64 per
shard) with ``crossdali.common.squirrel.write_squirrel_store``. Rows:

- Squirrel + torchvision: ``get_iter(key_hooks=[SplitByWorker])`` -> PIL decode + the v2 train
  preset -> ``batched`` -> ``to_torch_iterable()`` in a ``DataLoader`` with ``--workers``
  processes (the way Squirrel's docs load into PyTorch).
- Squirrel stream -> DALI external_source: the store iterated as one stream (the DALI + Squirrel
  tutorial's way), read in the main process (``serial``), in one dedicated DALI worker process, or
  (GPU) with ``--fetch-threads`` Squirrel threads fetching shards ahead.
- Squirrel shards -> DALI external_source: ``SquirrelSource`` as a sharded source (each batch a
  function of its index, ``crossdali.common.loading.external_readers.ShardBatches``), read in the main process or
  by ``--py-workers`` DALI worker processes, each unpacking different store shards.
- Decode and augment by DALI on the CPU or the GPU with ``--workers`` threads.
- DALI fn.readers.file on the same JPEGs as files: what the external source costs against DALI's
  own reader.

Each row: one warm-up epoch, then whole epochs until at least 2 epochs and ``--min-seconds``;
batches are consumed as float NCHW tensors on the GPU (CPU in ``--smoke``). Writes
``external_source.json`` (rewritten after every row) and ``external_source.png``.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import usage_error
from benchmarks.loader_rows import environment, run_rows
from benchmarks.plot import backend_color, bar_png
from crossdali.common.data.sample_data import ensure_classification
from crossdali.common.data.sources import resolve_source


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, add_help=add_help,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results/latest"), help="folder for the JSON and the PNG")
    parser.add_argument("--data-root", type=Path, default=None, help="where to build the sample set")
    parser.add_argument("--size", default="bench", help="sample set size (bench: 8,195 JPEGs)")
    parser.add_argument("--store", type=Path, default=None, help="Squirrel store folder (default: a temporary one)")
    parser.add_argument("-b", "--batch-size", type=int, default=256)
    parser.add_argument("--crop-size", type=int, default=224)
    parser.add_argument("--workers", type=int, default=15, help="DataLoader processes / DALI threads")
    parser.add_argument("--min-seconds", type=float, default=5.0)
    parser.add_argument("--fetch-threads", type=int, default=4,
                        help="Squirrel threads fetching store shards ahead in the extra GPU row (the others: 1)")
    parser.add_argument("--py-workers", type=int, default=8,
                        help="DALI Python worker processes of the parallel sharded rows")
    parser.add_argument("--cpu", action="store_true", help="CPU rows only, batches consumed on the CPU (no GPU needed)")
    parser.add_argument("--smoke", action="store_true", help="tiny set, CPU rows only, 64 px: checks the script runs")
    return parser


def _collate(samples):
    return torch.stack([s[0] for s in samples]), torch.tensor([s[1] for s in samples])


class _DecodeTransform:
    """PIL decode + the torchvision v2 train preset, for Squirrel's ``map`` (picklable for workers)."""

    def __init__(self, crop: int) -> None:
        from crossdali.common.classification import ClassificationTransform
        from crossdali.pytorch.presets import ClassificationPresetTrain

        self.preset = ClassificationPresetTrain(transform=ClassificationTransform(crop_size=crop))

    def __call__(self, sample: dict):
        import io

        from PIL import Image

        with Image.open(io.BytesIO(sample["image"])) as img:
            return self.preset(img.convert("RGB")), sample["label"]


def _squirrel_torch_loader(store: Path, *, batch_size: int, workers: int, crop: int):
    """Squirrel's PyTorch path, as its documentation shows it."""
    from squirrel.driver import MessagepackDriver
    from squirrel.iterstream.torch_composables import SplitByWorker

    it = (MessagepackDriver(str(store)).get_iter(key_hooks=[SplitByWorker], max_workers=1, flatten=True)
          .map(_DecodeTransform(crop))
          .batched(batch_size, collation_fn=_collate, drop_last_if_not_full=False)
          .to_torch_iterable())
    return torch.utils.data.DataLoader(it, batch_size=None, num_workers=workers, pin_memory=torch.cuda.is_available(),
                                       persistent_workers=workers > 0)


def plot(report: dict, png: Path) -> bool:
    """Bar chart of the rows; ``False`` where matplotlib is not installed (the JSON has everything)."""
    rows = [r for r in report["results"] if "img_s" in r]
    return bar_png(
        png, [r["name"] for r in rows], [r["img_s"] for r in rows], labels=[f"{r['img_s']:,.0f}" for r in rows],
        colors=[backend_color("dali-gpu" if "GPU" in r["name"] else "dali-cpu" if "DALI" in r["name"] else "")
                for r in rows],
        xlabel="images/s (higher is better)",
        title=f"Squirrel store -> RN50 train transform {report['crop_size']} px, batch {report['batch_size']}\n"
              f"{report['device']}, {report['cpu_count']} CPU cores, {report['dataset']['images']:,} JPEGs"
    ) is not None


def main(args: argparse.Namespace) -> dict:
    from crossdali.common.squirrel import SquirrelSource, write_squirrel_store
    from crossdali.pytorch import create_classification_loader
    from crossdali.pytorch.external import ExternalSourceOptions, create_external_source_loader

    if args.smoke:
        args.size, args.batch_size, args.workers, args.crop_size, args.min_seconds = "tiny", 32, 2, 64, 0.0
        args.py_workers = 2
        args.cpu = True
    elif not args.cpu and not torch.cuda.is_available():
        raise usage_error("no CUDA GPU here: pass --cpu for the CPU rows alone (or --smoke)")
    gpu = not args.cpu
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    args.out.mkdir(parents=True, exist_ok=True)
    root = ensure_classification(args.data_root, size=args.size, formats=("imagefolder",)) / "imagefolder"
    source = resolve_source(root, "train")
    tmp = None
    if args.store is None:
        tmp = tempfile.TemporaryDirectory(prefix="crossdali-squirrel-")
        args.store = Path(tmp.name) / "store"
    t0 = time.perf_counter()
    if not args.store.exists():
        write_squirrel_store(source, args.store, samples_per_shard=64)
    store_mib = sum(f.stat().st_size for f in args.store.rglob("*") if f.is_file()) / 2**20
    print(f"store: {source.num_samples} JPEGs, {store_mib:.0f} MiB at {args.store} "
          f"(written in {time.perf_counter() - t0:.1f} s)", flush=True)

    bs, crop, workers = args.batch_size, args.crop_size, args.workers
    squirrel = SquirrelSource(args.store, num_classes=source.num_classes)
    t0 = time.perf_counter()
    sizes = squirrel.shard_sizes  # counted once (every shard read), before the rows are timed
    count_s = time.perf_counter() - t0
    print(f"store: {len(sizes)} shards counted in {count_s:.2f} s", flush=True)
    stream = functools.partial(iter, squirrel)  # a generator-like callable: the store as one stream
    common = dict(train=True, batch_size=bs, crop_size=crop, workers=workers, device_id=0 if gpu else None)
    backends = ["dali-gpu", "dali-cpu"] if gpu else ["dali-cpu"]
    configs = [("Squirrel + torchvision (PIL, DataLoader)",
                lambda: _squirrel_torch_loader(args.store, batch_size=bs, workers=workers, crop=crop))]
    for backend in backends:
        where = "GPU" if backend == "dali-gpu" else "CPU"
        for parallel in (False, True):
            name = f"Squirrel stream -> DALI {where} external_source" + (" (one worker process)" if parallel
                                                                         else " (serial)")
            configs.append((name, lambda b=backend, p=parallel: create_external_source_loader(
                stream, backend=b, feed=ExternalSourceOptions(parallel=p), num_classes=source.num_classes, **common)))
        if gpu:  # the one-shard-at-a-time stream, not DALI, can be the limit: a stream with fetch threads beside it
            name = f"Squirrel stream ({args.fetch_threads} fetch threads) -> DALI {where} external_source (serial)"
            configs.append((name, lambda b=backend: create_external_source_loader(
                functools.partial(iter, SquirrelSource(args.store, num_classes=source.num_classes,
                                                       max_workers=args.fetch_threads)), backend=b,
                num_classes=source.num_classes, **common)))
        for py_workers in (0, args.py_workers):
            name = f"Squirrel shards -> DALI {where} external_source " + (
                f"({py_workers} worker processes)" if py_workers else "(serial)")
            configs.append((name, lambda b=backend, n=py_workers: create_external_source_loader(
                squirrel, backend=b, feed=ExternalSourceOptions(parallel=n > 0, py_workers=max(1, n)), **common)))
        configs.append((f"files -> DALI {where} fn.readers.file", lambda b=backend: create_classification_loader(
            source, backend=b, **common)))

    report = {
        **environment("external_source", device),
        "squirrel": __import__("importlib.metadata").metadata.version("squirrel-core"),
        "dataset": {"images": source.num_samples, "store_mib": store_mib, "store_shards": len(sizes),
                    "shard_count_seconds": round(count_s, 3)},
        "py_workers": args.py_workers,
        "batch_size": bs,
        "crop_size": crop,
        "workers": workers,
        "timing": f"1 warm-up epoch, then whole epochs until >= 2 epochs and >= {args.min_seconds:g} s",
        "results": [],
    }
    path = args.out / "external_source.json"
    run_rows([({"name": name}, make) for name, make in configs], device=device, min_seconds=args.min_seconds,
             report=report, path=path, width=68)
    if plot(report, args.out / "external_source.png"):
        print(f"wrote {path} and {path.with_suffix('.png')}")
    else:
        print(f"wrote {path} (no matplotlib here: no plot)")
    if tmp is not None:
        tmp.cleanup()
    return report


if __name__ == "__main__":
    main(get_args_parser().parse_args())
