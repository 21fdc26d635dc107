"""Images/s and data-wait of every PyTorch data backend on the same JPEGs (RN50 train transform).

    python -m benchmarks.classification_loaders --out results/     # on a GPU machine
    python -m benchmarks.plot results/classification_loaders.json  # bar chart next to it

Two measurements, both on the ``bench`` sample set (8,195 train JPEGs cut from real photos):

- loader: the bare input pipeline, batches consumed as float NCHW tensors on the GPU (what the
  DESIGN.md baseline measured). One epoch warms up (workers, caches, allocator); then whole
  epochs are timed until at least 2 epochs and ``--min-seconds`` (5 s) have passed.
- train: a training step (--arch, default ResNet-50; AMP on the GPU, channels-last) fed by the backend; images/s and the
  share of the step spent waiting for data. ``synthetic`` is the upper bound.

Configurations: torchvision ImageFolder + PIL, torchvision decode_image + v2 (crossdali's
``native``), torchvision's batched ``decode_jpeg`` on the GPU + the same v2 preset there, DALI
all-CPU, and DALI mixed with the hardware JPEG decoder share 0 / 0.5 / 0.75 / 1.0 and 2 / 4 / 8 /
15 CPU threads. Writes ``classification_loaders.json``, rewritten after every
configuration, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from benchmarks import usage_error
from benchmarks.loader_rows import environment, sync, time_epochs, write_report
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
    parser.add_argument("--skip-loader", action="store_true", help="only the training measurement")
    parser.add_argument("--min-seconds", type=float, default=5.0,
                        help="time whole epochs until at least this long (and at least 2 epochs) per loader")
    parser.add_argument("--train-warmup", type=int, default=10, help="untimed ResNet-50 steps before timing")
    parser.add_argument("--train-steps", type=int, default=30, help="timed ResNet-50 steps per backend")
    parser.add_argument("--train-threads", default="4,15",
                        help="DALI threads for the dali-gpu training rows (the other backends use --workers)")
    parser.add_argument("--arch", default="resnet50", help="torchvision model trained in the training rows")
    parser.add_argument("--crop-size", type=int, default=224, help="random-resized-crop size of every row")
    parser.add_argument("--smoke", action="store_true",
                        help="check the script on a CPU-only machine: tiny set, CPU backends, 2 steps")
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


class _FileBytes(torch.utils.data.Dataset):
    """(encoded bytes, label) per file: what a DataLoader worker hands a GPU decoder. Plain bytes,
    not tensors: a batch of small tensors from workers goes through one shared file descriptor each,
    and a 2-core run failed with EBADF that way."""

    def __init__(self, files: tuple[str, ...], labels: tuple[int, ...]) -> None:
        self.files, self.labels = files, labels

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        with open(self.files[i], "rb") as f:
            return bytearray(f.read()), self.labels[i]


def _bytes_batch(samples):
    return [data for data, _ in samples], torch.tensor([label for _, label in samples])


class _TorchvisionGPUDecodeLoader:
    """torchvision's batched ``decode_jpeg`` on ``device`` (nvJPEG on a GPU) over file bytes read by
    DataLoader workers, then the same v2 preset per image where the pixels are: the GPU path a
    torchvision user writes without DALI (issue 14 asks for it as a peer)."""

    def __init__(self, source, *, batch_size: int, workers: int, crop: int, device: torch.device) -> None:
        from crossdali.common.classification import ClassificationTransform
        from crossdali.pytorch.presets import ClassificationPresetTrain

        self.device = device
        self.preset = ClassificationPresetTrain(transform=ClassificationTransform(crop_size=crop))
        self.loader = torch.utils.data.DataLoader(_FileBytes(source.files, source.labels), batch_size=batch_size,
                                                  shuffle=True, num_workers=workers, collate_fn=_bytes_batch,
                                                  persistent_workers=workers > 0)

    def __iter__(self):
        from torchvision.io import ImageReadMode, decode_jpeg

        for datas, labels in self.loader:
            encoded = [torch.frombuffer(data, dtype=torch.uint8) for data in datas]
            images = decode_jpeg(encoded, mode=ImageReadMode.RGB, device=self.device)
            yield torch.stack([self.preset(image) for image in images]), labels


def _train_steps(loader, model, optimizer, scaler, device, steps: int, warmup: int = 10) -> dict[str, float]:
    """``steps`` RN50 training steps after ``warmup`` untimed ones; data wait measured per step."""
    model.train()
    it = iter(_forever(loader))
    wait, n, start = 0.0, 0, None
    for step in range(warmup + steps):
        if step == warmup:
            sync(device)
            wait, n, start = 0.0, 0, time.perf_counter()
        t0 = time.perf_counter()
        images, labels = next(it)
        images = images.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
        labels = labels.to(device, non_blocking=True)
        sync(device)  # the wait includes the host-to-device copy
        wait += time.perf_counter() - t0
        # AMP on the GPU only: this measures GPU training; CPU autocast (bfloat16) is emulated and slow
        # on CPUs without AVX-512/AMX bfloat16 instructions
        with torch.autocast(device.type, dtype=torch.float16, enabled=device.type == "cuda"):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        n += images.shape[0]
    sync(device)
    elapsed = time.perf_counter() - start
    return {"img_s": n / elapsed, "data_wait_share": wait / elapsed, "steps": steps}


def _forever(loader):
    while True:
        yield from loader


def main(args: argparse.Namespace) -> dict:
    if args.smoke:
        # only checks that the script runs: a tiny model at 64 px in float32, since a 2-core CPU without
        # bfloat16 instructions trains ResNet-50 at 224 px under autocast at well under 1 image/s
        args.size, args.batch_size, args.workers, args.threads, args.hw_loads, args.train_steps = "tiny", 32, 2, "", "", 2
        args.min_seconds, args.train_warmup = 0.0, 1
        args.train_threads, args.arch, args.crop_size = "", "resnet18", 64
    elif not torch.cuda.is_available():
        raise usage_error("this benchmark compares GPU-fed pipelines: run it on a machine with a CUDA GPU (or --smoke)")
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    root = ensure_classification(args.data_root, size=args.size, formats=("imagefolder",)) / "imagefolder"
    source = resolve_source(root, "train")
    sizes = [os.path.getsize(f) for f in source.files]
    print(f"data: {source.num_samples} JPEGs, mean {sum(sizes) / len(sizes) / 1024:.0f} KiB "
          f"(built/checked in {time.perf_counter() - t0:.0f} s)", flush=True)
    crop, bs, workers = args.crop_size, args.batch_size, args.workers
    common = dict(train=True, batch_size=bs, crop_size=crop)

    configs = [
        ("torchvision PIL ImageFolder", dict(kind="pil", workers=workers)),
        ("torchvision decode_image + v2 (native)", dict(backend="native", workers=workers)),
        (f"torchvision decode_jpeg on the {'GPU' if device.type == 'cuda' else 'CPU'} + v2",
         dict(kind="tv-decode-jpeg", workers=workers)),
        ("DALI CPU", dict(backend="dali-cpu", workers=workers)),
    ]
    for load in (float(x) for x in args.hw_loads.split(",") if x):
        configs.append((f"DALI GPU hw_decoder_load={load:g}", dict(backend="dali-gpu", workers=workers, hw_decoder_load=load)))
    for threads in (int(x) for x in args.threads.split(",") if x):
        if threads != workers:
            configs.append((f"DALI GPU hw_decoder_load=1 {threads} threads",
                            dict(backend="dali-gpu", workers=threads, hw_decoder_load=1.0)))

    results, train = [], []
    report = {
        **environment("classification_loaders", device),
        "dataset": {"images": source.num_samples, "mean_kib": sum(sizes) / len(sizes) / 1024},
        "batch_size": bs,
        "transform": f"decode + random-resized-crop {crop} + flip + normalize, float NCHW on the {device.type.upper()}",
        "train_model": f"{args.arch}, channels-last, " + ("AMP float16" if device.type == "cuda" else "float32 (no CPU AMP)"),
        "timing": (f"loader: 1 warm-up epoch, then whole epochs timed until >= 2 epochs and >= {args.min_seconds:g} s; "
                   f"train: {args.train_warmup} warm-up steps, then --train-steps timed"),
        "loader": results,
        "train": train,
    }
    path = args.out / "classification_loaders.json"
    for name, cfg in [] if args.skip_loader else configs:
        kind = cfg.pop("kind", None)
        row = {"name": name, "backend": kind or cfg["backend"], "threads": cfg["workers"],
               "hw_decoder_load": cfg.get("hw_decoder_load")}
        try:  # one failing configuration is recorded with its error; the others still run
            if kind == "pil":
                loader = _pil_imagefolder_loader(source, batch_size=bs, workers=cfg["workers"], crop=crop)
            elif kind == "tv-decode-jpeg":
                loader = _TorchvisionGPUDecodeLoader(source, batch_size=bs, workers=cfg["workers"], crop=crop,
                                                     device=device)
            else:
                loader = create_classification_loader(source, **common, **cfg, device_id=0)
            row.update(time_epochs(loader, device, min_seconds=args.min_seconds))
            print(f"{name:45s} {row['img_s']:9,.0f} img/s", flush=True)
            del loader
        except Exception as e:  # reported in the JSON
            row["error"] = f"{type(e).__name__}: {e}"
            print(f"{name:45s} FAILED: {row['error']}", flush=True)
        results.append(row)
        write_report(path, report)

    if not args.skip_train:
        import torchvision

        torch.backends.cudnn.benchmark = True
        train_configs = [("synthetic", dict(backend="synthetic", workers=workers))]
        train_configs += [(f"DALI GPU hw_decoder_load=1 {t} threads", dict(backend="dali-gpu", workers=t, hw_decoder_load=1.0))
                          for t in (int(x) for x in args.train_threads.split(",") if x)]
        train_configs += [("DALI CPU", dict(backend="dali-cpu", workers=workers)),
                          ("torchvision decode_image + v2 (native)", dict(backend="native", workers=workers))]
        if device.type == "cuda" and any(c["backend"] == "dali-gpu" for _, c in train_configs):
            # The first DALI GPU pipeline that runs next to the model trains slowly for a while (measured
            # 734 and 1,475 img/s against 4,062-4,416 for the later ones, whatever the thread count):
            # a one-off start-up cost, so an untimed row absorbs it; the JSON keeps its number.
            train_configs.insert(1, ("warm-up (first DALI GPU pipeline, not a result)",
                                     dict(backend="dali-gpu", workers=workers, hw_decoder_load=1.0)))
        for name, cfg in train_configs:
            if cfg["backend"] == "dali-gpu" and device.type != "cuda":
                continue
            row = {"name": name, "backend": cfg["backend"], "threads": cfg["workers"]}
            try:
                model = torchvision.models.get_model(args.arch, num_classes=source.num_classes)
                model = model.to(device).to(memory_format=torch.channels_last)
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
                scaler = torch.amp.GradScaler(device.type, enabled=device.type == "cuda")
                loader = create_classification_loader(source, **common, **cfg, device_id=0)
                row.update(_train_steps(loader, model, optimizer, scaler, device, args.train_steps, args.train_warmup))
                print(f"train {name:39s} {row['img_s']:9,.0f} img/s  data wait {100 * row['data_wait_share']:.0f} %",
                      flush=True)
                del loader, model, optimizer
            except Exception as e:  # reported in the JSON
                row["error"] = f"{type(e).__name__}: {e}"
                print(f"train {name:39s} FAILED: {row['error']}", flush=True)
            train.append(row)
            write_report(path, report)

    by_name = {r["name"]: r["img_s"] for r in results if "img_s" in r}
    for key, base in (("speedup_vs_native", "torchvision decode_image + v2 (native)"),
                      ("speedup_vs_pil", "torchvision PIL ImageFolder")):
        if base in by_name:
            report[key] = {name: img_s / by_name[base] for name, img_s in by_name.items()}
    write_report(path, report)
    print(f"wrote {path}")
    return report


if __name__ == "__main__":
    main(get_args_parser().parse_args())
