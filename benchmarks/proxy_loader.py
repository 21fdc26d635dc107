"""Images/s of the three ways a PyTorch user can load the same JPEGs with the RN50 train transform:
a plain ``DataLoader`` (PIL + torchvision), the same ``DataLoader`` with DALI Proxy doing the decode
and augmentation (``crossdali.pytorch.proxy``), and crossdali's own DALI loader
(docs/from-dataloader.md#1-dali-proxy-keep-your-dataset-and-dataloader).

    python -m benchmarks.proxy_loader                        # on a GPU machine: results/latest/proxy_loader.json
    python -m benchmarks.proxy_loader --cpu --size small -b 64 --workers 2 --threads 2 --out /tmp/pl
    python -m benchmarks.proxy_loader --smoke --out /tmp/pl  # tiny CPU run: checks the script runs

Data: the ``bench`` sample set's train split (8,195 JPEGs cut from real photos), read by every row
from the same files. Rows:

- plain DataLoader: torchvision ``ImageFolder`` (PIL decode) + the v2 train preset
  (``crossdali.pytorch.presets``) in ``--workers`` processes, batches pinned and moved to the GPU.
- DALI Proxy: a ``Dataset`` that returns each file's bytes and label, in a ``DataLoader`` with
  ``--workers`` processes; a ``DALIServer`` in the main process decodes and augments each batch
  with crossdali's train transform (``create_proxy_server``; ``dali-gpu``: mixed decoder with
  the hardware JPEG decoder, ``--threads`` DALI threads). On the CPU its ``dali-cpu`` variant.
- crossdali loader: ``create_classification_loader(backend="dali-gpu")`` (``dali-cpu`` on the
  CPU): DALI's file reader and the same transform, ``--threads`` threads, no ``DataLoader``.

Every loader is built and warmed up for one epoch first; then the rows take turns for ``--rounds``
rounds, each timing whole epochs until ``--min-seconds``, so that the machine's other load falls
on all of them alike. A row's images/s is its median round; ``over_plain_dataloader`` is each
round's ratio to the plain row of the same round (mean, min, max). Batches are consumed as float
NCHW tensors on the GPU (on the CPU with ``--cpu``). Writes ``proxy_loader.json`` + ``.png`` on a
GPU; CPU runs write ``proxy_loader_cpu.json`` + ``.png``, so they never replace the GPU results.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks import cpu_model, gpu_name, round_spread, usage_error
from benchmarks.loader_rows import environment, sync
from benchmarks.plot import backend_color, bar_png
from crossdali.common.data.sample_data import ensure_classification
from crossdali.common.data.sources import resolve_source

PLAIN = "plain DataLoader (PIL + torchvision v2)"


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, add_help=add_help,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results/latest"), help="folder for the JSON and the PNG")
    parser.add_argument("--data-root", type=Path, default=None, help="where to build the sample set")
    parser.add_argument("--size", default="bench", help="sample set size (bench: 8,195 train JPEGs)")
    parser.add_argument("-b", "--batch-size", type=int, default=256)
    parser.add_argument("--crop-size", type=int, default=224)
    parser.add_argument("--workers", type=int, default=15, help="DataLoader worker processes (plain and proxy rows)")
    parser.add_argument("--threads", type=int, default=15, help="DALI threads (proxy and crossdali rows)")
    parser.add_argument("--rounds", type=int, default=3, help="turns each row takes, interleaved with the others")
    parser.add_argument("--min-seconds", type=float, default=5.0, help="timed whole epochs per row and round")
    parser.add_argument("--cpu", action="store_true", help="CPU rows only (dali-cpu), batches stay on the CPU")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny set, CPU rows, batch 32, 2 workers and threads, 64 px, 1 round: checks the script runs")
    return parser


class FileBytes(torch.utils.data.Dataset):
    """The user's ``Dataset`` of the proxy row: each file's encoded bytes and its label, nothing decoded."""

    def __init__(self, files, labels) -> None:
        self.files, self.labels = files, labels

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        return np.fromfile(self.files[i], dtype=np.uint8), self.labels[i]


def _plain_loader(source, *, batch_size: int, workers: int, crop: int, pin: bool):
    """The loader most PyTorch code runs. Spawned workers: forked after DALI's threads and CUDA are up
    (the other rows), a DataLoader's workers have hung (benchmarks/loader_formats.py says the same)."""
    from torchvision.datasets import ImageFolder

    from crossdali.common.classification import ClassificationTransform
    from crossdali.pytorch.presets import ClassificationPresetTrain

    preset = ClassificationPresetTrain(transform=ClassificationTransform(crop_size=crop))
    return torch.utils.data.DataLoader(ImageFolder(str(source.root), transform=preset), batch_size=batch_size,
                                       shuffle=True, num_workers=workers, pin_memory=pin, persistent_workers=True,
                                       multiprocessing_context="spawn")


def _epochs(loader, device: torch.device, *, min_seconds: float) -> dict:
    """Whole epochs, each batch moved to ``device``, until ``min_seconds`` (at least one epoch)."""
    sync(device)
    n, epochs, start = 0, 0, time.perf_counter()
    while epochs < 1 or time.perf_counter() - start < min_seconds:
        for images, labels in loader:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            n += images.shape[0]
        epochs += 1
    sync(device)
    elapsed = time.perf_counter() - start
    assert images.shape[1] == 3 and images.shape[2] == images.shape[3] and images.dtype == torch.float32, images.shape
    return {"images": n, "epochs": epochs, "seconds": elapsed, "img_s": n / elapsed}


def plot(report: dict, png: Path) -> bool:
    """Bar chart of the rows; ``False`` where matplotlib is not installed (the JSON has everything)."""
    rows = [r for r in report["results"] if "img_s" in r]
    return bar_png(
        png, [r["name"] for r in rows], [r["img_s"] for r in rows], labels=[f"{r['img_s']:,.0f}" for r in rows],
        colors=[backend_color(r["backend"]) for r in rows], width=10, xlabel="images/s (higher is better)",
        title=f"The same JPEGs, RN50 train transform {report['crop_size']} px, batch {report['batch_size']}\n"
              f"{report['gpu'] or report['cpu']}, {report['cpu_count']} CPU cores, {report['dataset']['images']:,} "
              f"JPEGs, median of {report['rounds']} rounds"
    ) is not None


def main(args: argparse.Namespace) -> dict:
    from crossdali.pytorch import create_classification_loader
    from crossdali.pytorch.proxy import create_proxy_loader, create_proxy_server

    if args.smoke:
        args.size, args.batch_size, args.workers, args.threads, args.crop_size = "tiny", 32, 2, 2, 64
        args.rounds, args.min_seconds, args.cpu = 1, 0.0, True
    elif not args.cpu and not torch.cuda.is_available():
        raise usage_error("no CUDA GPU here: pass --cpu for the CPU rows alone (or --smoke)")
    if args.rounds < 1 or args.workers < 1 or args.threads < 1:
        raise usage_error("--rounds, --workers and --threads must be at least 1 (the proxy needs DataLoader workers)")
    gpu = not args.cpu
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    backend = "dali-gpu" if gpu else "dali-cpu"
    where = "GPU" if gpu else "CPU"
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    source = resolve_source(ensure_classification(args.data_root, size=args.size, formats=("imagefolder",))
                            / "imagefolder", "train")
    mean_kib = sum(Path(f).stat().st_size for f in source.files) / source.num_samples / 1024
    print(f"data: {source.num_samples} JPEGs ({mean_kib:.0f} KiB mean), built/checked in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)

    bs, crop, workers, threads = args.batch_size, args.crop_size, args.workers, args.threads
    report = {
        **environment("proxy_loader", device),
        "gpu": gpu_name() if gpu else None,
        "cpu": cpu_model(),
        "size": args.size,
        "dataset": {"images": source.num_samples, "jpeg_mean_kib": mean_kib},
        "batch_size": bs,
        "crop_size": crop,
        "workers": workers,
        "threads": threads,
        "rounds": args.rounds,
        "transform": f"decode + random-resized-crop {crop} + flip + normalize, float NCHW on the {device.type.upper()}",
        "timing": f"1 warm-up epoch per row, then {args.rounds} interleaved rounds of whole epochs "
                  f">= {args.min_seconds:g} s per row; img_s = median round",
        "results": [],
    }
    stem = "proxy_loader" if gpu else "proxy_loader_cpu"
    path = args.out / f"{stem}.json"
    with contextlib.ExitStack() as stack:
        # Built in this order: the proxy's workers must fork (persistent) before CUDA and DALI's
        # threads are up in this process; the plain row's workers are spawned.
        server = stack.enter_context(create_proxy_server(train=True, backend=backend, batch_size=bs, crop_size=crop,
                                                         workers=threads, seed=0))
        configs = [
            (dict(name=f"DALI Proxy: DataLoader ({workers} workers) -> DALI {where}", backend=backend, kind="proxy"),
             lambda: create_proxy_loader(server, FileBytes(source.files, source.labels), batch_size=bs,
                                         num_workers=workers, shuffle=True, persistent_workers=True)),
            (dict(name=f"{PLAIN}, {workers} workers", backend="torchvision", kind="plain"),
             lambda: _plain_loader(source, batch_size=bs, workers=workers, crop=crop, pin=gpu)),
            (dict(name=f"crossdali loader, DALI {where} ({threads} threads)", backend=backend, kind="crossdali"),
             lambda: create_classification_loader(source, train=True, backend=backend, batch_size=bs, crop_size=crop,
                                                  workers=threads, seed=0)),
        ]
        rows, loaders = [], []
        for row, make in configs:
            try:
                loader = make()
                warm = _epochs(loader, device, min_seconds=0.0)
                row |= {"warmup_img_s": warm["img_s"], "rounds_img_s": []}
                loaders.append(loader)
                print(f"{row['name']:60s} warm-up {warm['img_s']:9,.0f} img/s", flush=True)
            except Exception as e:  # noqa: BLE001 - an unattended run records the failure and goes on
                row["error"] = f"{type(e).__name__}: {e}"
                loaders.append(None)
                print(f"{row['name']:60s} FAILED: {row['error']}", flush=True)
            rows.append(row)
        report["results"] = sorted(rows, key=lambda row: ["plain", "proxy", "crossdali"].index(row["kind"]))
        for r in range(args.rounds):
            for row, loader in zip(rows, loaders):
                if loader is None or "error" in row:
                    continue
                try:
                    got = _epochs(loader, device, min_seconds=args.min_seconds)
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {e}"
                    continue
                row["rounds_img_s"].append(got["img_s"])
                row |= {k: got[k] for k in ("images", "epochs", "seconds")}
                row["img_s"] = statistics.median(row["rounds_img_s"])
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                f"{row['kind']} {row['rounds_img_s'][-1]:,.0f}" for row in report["results"] if row.get("rounds_img_s"))
                + " img/s", flush=True)
            _ratios(report)
            path.write_text(json.dumps(report, indent=2) + "\n")
        del loaders
    if plot(report, args.out / f"{stem}.png"):
        print(f"wrote {path} and {path.with_suffix('.png')}")
    else:
        print(f"wrote {path} (no matplotlib here: no plot)")
    return report


def _ratios(report: dict) -> None:
    """Each row's images/s over the plain DataLoader's, round by round."""
    plain = next((r for r in report["results"] if r["kind"] == "plain" and r.get("rounds_img_s")), None)
    if plain is None:
        return
    report["over_plain_dataloader"] = {
        r["name"]: round_spread([a / b for a, b in zip(r["rounds_img_s"], plain["rounds_img_s"])])
        for r in report["results"] if r is not plain and r.get("rounds_img_s")}


if __name__ == "__main__":
    main(get_args_parser().parse_args())
