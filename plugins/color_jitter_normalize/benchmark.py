"""Speed of ``fn.crossdali.color_jitter_normalize`` against the three DALI operators it fuses.

    python -m crossdali.common.plugins build
    python plugins/color_jitter_normalize/benchmark.py --device gpu --out results/latest/custom_operator.json

Both spellings run on the same batch of random 300x300 uint8 images (SSD's size after resize), fed by
``fn.external_source`` (already on the GPU for ``--device gpu``, through PyTorch), with SSD's jitter
ranges, in interleaved rounds; only the colour jitter and normalisation run, so the numbers are the
operators' own. Prints and writes images/s for each and their ratio per round.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path

import numpy as np

MEAN, STD = [0.485 * 255, 0.456 * 255, 0.406 * 255], [0.229 * 255, 0.224 * 255, 0.225 * 255]


def _pipeline(fused: bool, images: list[np.ndarray], *, device: str, threads: int):
    from nvidia.dali import fn, pipeline_def, types

    from crossdali.common.plugins import color_jitter_normalize

    @pipeline_def(batch_size=len(images), num_threads=threads, device_id=0 if device == "gpu" else None, seed=1,
                  prefetch_queue_depth=1)
    def pipe():
        img = fn.external_source(source=lambda: images, layout="HWC", device=device, no_copy=device == "gpu")
        hue, sat = fn.random.uniform(range=[-18.0, 18.0]), fn.random.uniform(range=[0.5, 1.5])
        bri, con = fn.random.uniform(range=[0.875, 1.125]), fn.random.uniform(range=[0.5, 1.5])
        flip = fn.random.coin_flip()
        if fused:
            return color_jitter_normalize(img, hue=hue, saturation=sat, brightness=bri, contrast=con, mirror=flip,
                                          mean=MEAN, std=STD)
        img = fn.hsv(img, hue=hue, saturation=sat)
        img = fn.brightness_contrast(img, brightness=bri, contrast=con)
        return fn.crop_mirror_normalize(img, dtype=types.FLOAT, output_layout="CHW", mean=MEAN, std=STD, mirror=flip)

    p = pipe()
    p.build()
    return p


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _gpu_name() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0] if out else None


def main(args: argparse.Namespace) -> dict:
    import nvidia.dali as dali

    from crossdali.common.plugins import load_plugin

    lib = load_plugin()
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (300, 300, 3), dtype=np.uint8) for _ in range(args.batch_size)]
    if args.device == "gpu":  # on the GPU once, so that no copy is timed
        import torch

        images = [torch.from_numpy(x).cuda() for x in images]
    pipes = {name: _pipeline(name == "fused", images, device=args.device, threads=args.threads)
             for name in ("three_operators", "fused")}
    seconds = {name: [] for name in pipes}
    for _ in range(args.rounds):
        for name, pipe in pipes.items():
            for _ in range(args.warmup):
                pipe.run()
            start = time.perf_counter()
            for _ in range(args.iters):
                out = pipe.run()
            if args.device == "gpu":
                out[0].as_cpu()  # the last batch finished
            seconds[name].append((time.perf_counter() - start) / args.iters)
    result = {
        "device": args.device, "gpu": _gpu_name() if args.device == "gpu" else None, "cpu": _cpu_model(),
        "dali": dali.__version__, "library": str(lib), "batch_size": args.batch_size, "threads": args.threads,
        "image": [300, 300, 3],
        "images_per_s": {name: args.batch_size / min(s) for name, s in seconds.items()},
        "fused_speedup_per_round": [t / f for t, f in zip(seconds["three_operators"], seconds["fused"])],
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, add_help=add_help,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("-b", "--batch-size", type=int, default=64)
    parser.add_argument("-j", "--threads", type=int, default=4, help="DALI threads (the CPU operators use them)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--iters", type=int, default=20, help="timed batches per spelling and round")
    parser.add_argument("--warmup", type=int, default=3, help="untimed batches before each timed run")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    return parser


if __name__ == "__main__":
    main(get_args_parser().parse_args())
