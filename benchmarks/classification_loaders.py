"""Images/s and data-wait of every PyTorch data backend on the same JPEGs (RN50 train transform).

    python -m benchmarks.classification_loaders --out results/     # on a GPU machine
    python -m benchmarks.plot results/classification_loaders.json  # bar chart next to it

Two measurements, both on the ``bench`` sample set (8,195 train JPEGs cut from real photos):

- loader: the bare input pipeline, batches consumed as float NCHW tensors on the GPU (what the
  DESIGN.md baseline measured). Epoch 1 warms up (workers, caches, allocator); epoch 2 is timed.
- train: a ResNet-50 training step (AMP, channels-last) fed by the backend; images/s and the
  share of the step spent waiting for data. ``synthetic`` is the upper bound.

Configurations: torchvision ImageFolder + PIL, torchvision decode_image + v2 (crossdali's
``native``), DALI all-CPU, and DALI mixed with the hardware JPEG decoder share 0 / 0.5 / 0.75 /
1.0 and 2 / 4 / 8 / 15 CPU threads. Writes ``classification_loaders.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from crossdali.common.sample_data import ensure_classification
from crossdali.common.sources import resolve_source
from crossdali.pytorch import create_classification_loader


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, add_help=add_help, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results"), help="folder for the JSON")
    parser.add_argument("--data-root", type=Path, default=None, help="where to build the bench sample set")
    parser.add_argument("--size", default="bench", help="sample set size (bench: 8,195 JPEGs)")
    parser.add_argument("-b", "--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=15, help="threads / workers for the main comparison")
    parser.add_argument("--threads", default="2,4,8,15", help="thread counts for the dali-gpu sweep")
    parser.add_argument("--hw-loads", default="0,0.5,0.75,1.0", help="hw_decoder_load values for the sweep")
    parser.add_argument("--skip-train", action="store_true", help="only the bare loader measurement")
    parser.add_argument("--train-steps", type=int, default=30, help="timed ResNet-50 steps per backend")
    return parser


def _pil_imagefolder_loader(source, *, batch_size: int, workers: int, crop: int):
    """The loader most PyTorch code runs: torchvision ImageFolder (PIL decode) + v2 preset."""
    from torchvision.datasets import ImageFolder

    from crossdali.common.classification import ClassificationTransform
    from crossdali.pytorch.presets import ClassificationPresetTrain

    preset = ClassificationPresetTrain(transform=ClassificationTransform(crop_size=crop))
    dataset = ImageFolder(str(source.root), transform=preset)
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                                       pin_memory=True, persistent_workers=True, drop_last=False)


def _consume(loader, device, *, epochs: int = 2) -> dict[str, float]:
    """Iterate ``epochs`` epochs, moving each batch to the GPU; time the last one."""
    stats = {}
    for _ in range(epochs):
        n, start = 0, time.perf_counter()
        for images, labels in loader:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            n += images.shape[0]
        torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
        stats = {"images": n, "seconds": elapsed, "img_s": n / elapsed}
    return stats


def _train_steps(loader, model, optimizer, scaler, device, steps: int) -> dict[str, float]:
    """``steps`` RN50 training steps after 10 warm-up steps; data wait measured per step."""
    model.train()
    it = iter(_forever(loader))
    wait, n, start = 0.0, 0, None
    for step in range(10 + steps):
        if step == 10:
            torch.cuda.synchronize(device)
            wait, n, start = 0.0, 0, time.perf_counter()
        t0 = time.perf_counter()
        images, labels = next(it)
        images = images.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
        labels = labels.to(device, non_blocking=True)
        torch.cuda.synchronize(device)  # the wait includes the host-to-device copy
        wait += time.perf_counter() - t0
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        n += images.shape[0]
    torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    return {"img_s": n / elapsed, "data_wait_share": wait / elapsed, "steps": steps}


def _forever(loader):
    while True:
        yield from loader


def main(args: argparse.Namespace) -> dict:
    if not torch.cuda.is_available():
        raise SystemExit("this benchmark compares GPU-fed pipelines: run it on a machine with a CUDA GPU")
    device = torch.device("cuda", 0)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    root = ensure_classification(args.data_root, size=args.size, formats=("imagefolder",)) / "imagefolder"
    source = resolve_source(root, "train")
    sizes = [os.path.getsize(f) for f in source.files]
    print(f"data: {source.num_samples} JPEGs, mean {sum(sizes) / len(sizes) / 1024:.0f} KiB "
          f"(built/checked in {time.perf_counter() - t0:.0f} s)", flush=True)
    crop, bs, workers = 224, args.batch_size, args.workers
    common = dict(train=True, batch_size=bs, crop_size=crop)

    configs = [
        ("torchvision PIL ImageFolder", dict(kind="pil", workers=workers)),
        ("torchvision decode_image + v2 (native)", dict(backend="native", workers=workers)),
        ("DALI CPU", dict(backend="dali-cpu", workers=workers)),
    ]
    for load in (float(x) for x in args.hw_loads.split(",")):
        configs.append((f"DALI GPU hw_decoder_load={load:g}", dict(backend="dali-gpu", workers=workers, hw_decoder_load=load)))
    for threads in (int(x) for x in args.threads.split(",")):
        if threads != workers:
            configs.append((f"DALI GPU hw_decoder_load=1 {threads} threads",
                            dict(backend="dali-gpu", workers=threads, hw_decoder_load=1.0)))

    results = []
    for name, cfg in configs:
        kind = cfg.pop("kind", None)
        if kind == "pil":
            loader = _pil_imagefolder_loader(source, batch_size=bs, workers=cfg["workers"], crop=crop)
        else:
            loader = create_classification_loader(source, **common, **cfg, device_id=0)
        stats = _consume(loader, device)
        row = {"name": name, "backend": kind or cfg["backend"], "threads": cfg["workers"],
               "hw_decoder_load": cfg.get("hw_decoder_load"), **stats}
        results.append(row)
        print(f"{name:45s} {stats['img_s']:9,.0f} img/s", flush=True)
        del loader

    train = []
    if not args.skip_train:
        import torchvision

        torch.backends.cudnn.benchmark = True
        for name, cfg in [("synthetic", dict(backend="synthetic", workers=workers)),
                          ("DALI GPU hw_decoder_load=1", dict(backend="dali-gpu", workers=workers, hw_decoder_load=1.0)),
                          ("DALI CPU", dict(backend="dali-cpu", workers=workers)),
                          ("torchvision decode_image + v2 (native)", dict(backend="native", workers=workers))]:
            model = torchvision.models.resnet50(num_classes=11).to(device).to(memory_format=torch.channels_last)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            scaler = torch.amp.GradScaler("cuda")
            loader = create_classification_loader(source, **common, **cfg, device_id=0)
            stats = _train_steps(loader, model, optimizer, scaler, device, args.train_steps)
            train.append({"name": name, "backend": cfg["backend"], "threads": workers, **stats})
            print(f"train {name:39s} {stats['img_s']:9,.0f} img/s  data wait {100 * stats['data_wait_share']:.0f} %",
                  flush=True)
            del loader, model, optimizer

    by_name = {r["name"]: r["img_s"] for r in results}
    native = by_name["torchvision decode_image + v2 (native)"]
    report = {
        "benchmark": "classification_loaders",
        "command": "python -m benchmarks.classification_loaders --out results/",
        "device": torch.cuda.get_device_name(device),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "dali": __import__("nvidia.dali").dali.__version__,
        "dataset": {"images": source.num_samples, "mean_kib": sum(sizes) / len(sizes) / 1024},
        "batch_size": bs,
        "transform": "decode + random-resized-crop 224 + flip + normalize, float NCHW on the GPU",
        "loader": results,
        "train_resnet50_amp": train,
        "speedup_vs_native": {r["name"]: r["img_s"] / native for r in results},
        "speedup_vs_pil": {r["name"]: r["img_s"] / by_name["torchvision PIL ImageFolder"] for r in results},
    }
    path = args.out / "classification_loaders.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")
    return report


if __name__ == "__main__":
    main(get_args_parser().parse_args())
