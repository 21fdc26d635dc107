"""Images/s of the PyTorch loaders over the other input formats, WebDataset shards and multi-label
lists, each beside its peer in the same run, all with the RN50 train transform.

    python -m benchmarks.loader_formats                         # on a GPU machine (DALI GPU and CPU rows): results/latest
    python -m benchmarks.loader_formats --cpu --size small -b 64 --workers 2 --py-workers 2 --out /tmp/lf
    python -m benchmarks.loader_formats --smoke --out /tmp/lf   # tiny CPU run (CI)

Data: the ``bench`` sample sets, built once under ``--data-root``: the classification set (8,195
JPEGs cut from real photos) as an ImageFolder and as WebDataset shards of the same JPEGs (256
samples a tar, with DALI's ``wds2idx`` index), and the multi-label set (8,000 448-px JPEGs, 2x2
grids of 1-3 class photos; ``train.txt``: ``images/train/00000.jpg coffee rocket``). Rows:

- WebDataset shards -> ``create_classification_loader`` (``fn.readers.webdataset``, the ``.cls``
  text parsed inside the pipeline), beside the same JPEGs as an ImageFolder (``fn.readers.file``)
  on the same backend: what the format costs.
- multi-label list -> ``create_multilabel_loader`` (``fn.external_source``, multi-hot labels), the
  files read in the main process (serial) or in ``--py-workers`` DALI worker processes, beside a
  torchvision ``DataLoader`` over the same list (PIL decode + the v2 train preset, multi-hot
  labels) with ``--workers`` processes.

DALI rows run on the GPU (``dali-gpu``) and on the CPU (``dali-cpu``), the CPU alone with ``--cpu``;
``--workers`` is DALI's thread count. Each row: one warm-up epoch, then whole epochs until at least
2 epochs and ``--min-seconds``; batches are consumed as float NCHW tensors on the GPU (CPU with
``--cpu``). Writes ``loader_formats.json`` (rewritten after every row; a failing row records its
error) and ``loader_formats.png``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from benchmarks import usage_error
from benchmarks.loader_rows import environment, run_rows
from benchmarks.plot import backend_color, bar_png
from crossdali.common.data.sample_data import ensure_classification, ensure_multilabel
from crossdali.common.data.sources import resolve_source


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, add_help=add_help,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results/latest"), help="folder for the JSON and the PNG")
    parser.add_argument("--data-root", type=Path, default=None, help="where to build the sample sets")
    parser.add_argument("--size", default="bench",
                        help="sample set size (bench: 8,195 JPEGs and 8,000 multi-label 448-px composites)")
    parser.add_argument("-b", "--batch-size", type=int, default=256)
    parser.add_argument("--crop-size", type=int, default=224)
    parser.add_argument("--workers", type=int, default=15, help="DALI threads / DataLoader processes")
    parser.add_argument("--py-workers", type=int, default=4,
                        help="DALI Python worker processes reading the multi-label files (the parallel rows)")
    parser.add_argument("--min-seconds", type=float, default=5.0,
                        help="time whole epochs until at least this long (and at least 2 epochs) per row")
    parser.add_argument("--skip-multilabel", action="store_true",
                        help="ImageFolder and WebDataset rows only (the multi-label bench set takes minutes to build)")
    parser.add_argument("--cpu", action="store_true", help="DALI CPU rows only, batches consumed on the CPU (no GPU needed)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sets, CPU rows, batch 32, 2 workers, 64 px: checks the script runs")
    return parser


class _MultiLabelDataset(torch.utils.data.Dataset):
    """The list read by ``read_multilabel_list``: PIL decode + the torchvision v2 train preset,
    ``(classes,)`` float32 multi-hot labels (what ``create_multilabel_loader`` delivers)."""

    def __init__(self, source, crop: int) -> None:
        from crossdali.common.classification import ClassificationTransform
        from crossdali.pytorch.presets import ClassificationPresetTrain

        self.files, self.labels, self.num_classes = source.files, source.labels, source.num_classes
        self.preset = ClassificationPresetTrain(transform=ClassificationTransform(crop_size=crop))

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        from PIL import Image

        with Image.open(self.files[i]) as img:
            image = self.preset(img.convert("RGB"))
        target = torch.zeros(self.num_classes, dtype=torch.float32)
        target[list(self.labels[i])] = 1.0
        return image, target


def _multilabel_torch_loader(source, *, batch_size: int, workers: int, crop: int):
    # spawned workers: forked workers started after the DALI rows (CUDA up, DALI's threads and Python
    # worker pools alive) have delivered nothing, and the row hung
    context = "spawn" if workers > 0 else None
    return torch.utils.data.DataLoader(_MultiLabelDataset(source, crop), batch_size=batch_size, shuffle=True,
                                       num_workers=workers, pin_memory=torch.cuda.is_available(),
                                       persistent_workers=workers > 0, drop_last=False,
                                       multiprocessing_context=context)


def _mean_kib(files) -> float:
    return sum(os.path.getsize(f) for f in files) / len(files) / 1024


def plot(report: dict, png: Path) -> bool:
    """Bar chart of the rows; ``False`` where matplotlib is not installed (the JSON has everything)."""
    rows = [r for r in report["results"] if "img_s" in r]
    data = report["dataset"]
    return bar_png(
        png, [r["name"] for r in rows], [r["img_s"] for r in rows], labels=[f"{r['img_s']:,.0f}" for r in rows],
        colors=[backend_color(r["backend"]) for r in rows], width=10,
        xlabel="images/s (higher is better)",
        title=f"Input formats -> RN50 train transform {report['crop_size']} px, batch {report['batch_size']}\n"
              f"{report['device']}, {report['cpu_count']} CPU cores, {data['jpegs']:,} JPEGs "
              f"({data['webdataset_shards']} shards)"
              + (f", {data['multilabel_images']:,} multi-label images" if "multilabel_images" in data else "")
    ) is not None


def main(args: argparse.Namespace) -> dict:
    from crossdali.pytorch import create_classification_loader
    from crossdali.pytorch.multilabel import create_multilabel_loader, resolve_multilabel_source

    if args.smoke:
        args.size, args.batch_size, args.workers, args.py_workers = "tiny", 32, 2, 2
        args.crop_size, args.min_seconds, args.cpu = 64, 0.0, True
    elif not args.cpu and not torch.cuda.is_available():
        raise usage_error("no CUDA GPU here: pass --cpu for the DALI CPU rows alone (or --smoke)")
    gpu = not args.cpu
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    root = ensure_classification(args.data_root, size=args.size, formats=("imagefolder", "webdataset"))
    files = resolve_source(root / "imagefolder", "train")
    shards = resolve_source(root / "webdataset", "train")
    multilabel = None if args.skip_multilabel else \
        resolve_multilabel_source(ensure_multilabel(args.data_root, size=args.size), "train")
    dataset = {
        "jpegs": files.num_samples, "jpeg_mean_kib": _mean_kib(files.files),
        "webdataset_samples": shards.num_samples, "webdataset_shards": len(shards.paths),
        "webdataset_mib": sum(os.path.getsize(p) for p in shards.paths) / 2**20,
    }
    if multilabel is not None:
        dataset.update(multilabel_images=multilabel.num_samples, multilabel_classes=multilabel.num_classes,
                       multilabel_mean_kib=_mean_kib(multilabel.files),
                       multilabel_labels_per_image=sum(map(len, multilabel.labels)) / multilabel.num_samples)
    labelled = "" if multilabel is None else \
        f", {multilabel.num_samples} multi-label images ({dataset['multilabel_mean_kib']:.0f} KiB mean)"
    print(f"data: {files.num_samples} JPEGs ({dataset['jpeg_mean_kib']:.0f} KiB mean), {shards.num_samples} in "
          f"{len(shards.paths)} WebDataset shards{labelled} (built/checked in {time.perf_counter() - t0:.0f} s)",
          flush=True)

    bs, crop, workers, py_workers = args.batch_size, args.crop_size, args.workers, args.py_workers
    common = dict(train=True, batch_size=bs, crop_size=crop, workers=workers, device_id=0 if gpu else None)
    configs = []  # (row fields, factory)
    for backend in ["dali-gpu", "dali-cpu"] if gpu else ["dali-cpu"]:
        where = "GPU" if backend == "dali-gpu" else "CPU"
        row = dict(backend=backend, threads=workers)
        configs += [
            (dict(name=f"ImageFolder JPEGs -> DALI {where} readers.file", format="imagefolder", **row),
             lambda b=backend: create_classification_loader(files, backend=b, **common)),
            (dict(name=f"WebDataset shards -> DALI {where} readers.webdataset", format="webdataset", **row),
             lambda b=backend: create_classification_loader(shards, backend=b, **common)),
            (dict(name=f"multi-label list -> DALI {where} external_source (serial)", format="multilabel",
                  py_workers=0, **row),
             lambda b=backend: create_multilabel_loader(multilabel, backend=b, py_workers=0, **common)),
            (dict(name=f"multi-label list -> DALI {where} external_source "
                       f"({py_workers} worker process{'es' if py_workers > 1 else ''})",
                  format="multilabel", py_workers=py_workers, **row),
             lambda b=backend: create_multilabel_loader(multilabel, backend=b, py_workers=py_workers, **common)),
        ]
    if multilabel is None:
        configs = [c for c in configs if c[0]["format"] != "multilabel"]
    else:
        configs.append((dict(name=f"multi-label list -> torchvision (PIL, DataLoader, {workers} workers)",
                             format="multilabel", backend="torchvision", workers=workers),
                        lambda: _multilabel_torch_loader(multilabel, batch_size=bs, workers=workers, crop=crop)))

    report = {
        **environment("loader_formats", device),
        "size": args.size,
        "dataset": dataset,
        "batch_size": bs,
        "crop_size": crop,
        "workers": workers,
        "py_workers": py_workers,
        "transform": f"decode + random-resized-crop {crop} + flip + normalize, float NCHW on the {device.type.upper()}",
        "timing": f"1 warm-up epoch, then whole epochs until >= 2 epochs and >= {args.min_seconds:g} s",
        "results": [],
    }
    path = args.out / "loader_formats.json"
    run_rows(configs, device=device, min_seconds=args.min_seconds, report=report, path=path, width=66)
    if plot(report, args.out / "loader_formats.png"):
        print(f"wrote {path} and {path.with_suffix('.png')}")
    else:
        print(f"wrote {path} (no matplotlib here: no plot)")
    return report


if __name__ == "__main__":
    main(get_args_parser().parse_args())
