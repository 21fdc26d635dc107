"""Files/s of `crossdali check`'s fast and full passes, next to the decode rate of the loader itself.

    python -m benchmarks.check_speed --size small --out results/check_speed        # CPU here
    python -m benchmarks.check_speed --size bench --device gpu --out results/check_speed_h100
    python -m benchmarks.check_speed --smoke --out /tmp/check_speed                 # tiny, CPU

The target on a GPU: the full pass at >= 80 % of the loader's own decode rate (a DALI file reader
+ ``fn.decoders.image``, the classification val pipeline's decoder). The loader is timed twice:
its steady rate (after a warm-up batch) and one epoch from construction, pipeline build included,
which is what the check's timing includes too (it builds its own decoder). The cache is off for
every timed pass. Writes ``check_speed.json`` and ``check_speed.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from benchmarks.plot import bar_png


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, add_help=add_help,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=None, help="an ImageFolder split (default: the sample set's train/)")
    parser.add_argument("--size", default="small", help="sample set size when --data is not given")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("-j", "--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("-b", "--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per pass (the best is kept)")
    parser.add_argument("--processes", type=int, default=None,
                        help="header-inspecting processes (default: the checker's choice for this machine)")
    parser.add_argument("--chunk", type=int, default=None,
                        help="samples per pipelined decode chunk (default: the checker's, per device)")
    parser.add_argument("--smoke", action="store_true", help="tiny set, one repeat (CI)")
    parser.add_argument("--out", type=Path, default=Path("results/check_speed"))
    return parser


def loader_decode_rate(files: list[str], *, device: str, workers: int, batch_size: int) -> tuple[float, float]:
    """Images/s of a DALI file reader + image decoder over ``files``: (one epoch after a warm-up
    batch, one epoch timed from the pipeline's construction)."""
    from nvidia.dali import fn, pipeline_def, types

    gpu = device == "gpu"

    @pipeline_def(batch_size=batch_size, num_threads=workers, device_id=0 if gpu else None)
    def decode():
        jpegs, _ = fn.readers.file(files=files, name="Reader")
        return fn.decoders.image(jpegs, device="mixed" if gpu else "cpu", output_type=types.RGB)

    batches = -(-len(files) // batch_size)
    built = time.perf_counter()
    pipe = decode()
    pipe.build()
    pipe.run()
    timed = max(1, batches - 1)  # the rest of the epoch (one batch more on a one-batch set)
    start = time.perf_counter()
    for _ in range(timed):
        pipe.run()
    end = time.perf_counter()
    return timed * batch_size / (end - start), (timed + 1) * batch_size / (end - built)


def _timed(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main(args: argparse.Namespace) -> dict:
    from crossdali.common.check.core import CheckSettings, check_image_files
    from crossdali.common.sources import scan_image_folder

    if args.smoke:
        args.size, args.repeats = "tiny", 1
    if args.chunk:
        from crossdali.common.check import decode

        decode.CHUNK_SAMPLES[args.device] = args.chunk
    if args.data is None:
        from crossdali.common.sample_data import ensure_classification

        args.data = ensure_classification(size=args.size, formats=("imagefolder",)) / "imagefolder" / "train"
    files = list(scan_image_folder(args.data, validate=False).files)
    megabytes = sum(os.path.getsize(f) for f in files) / 2**20
    rows = {}
    for depth in ("fast", "full"):
        settings = CheckSettings(depth=depth, device=args.device, threads=args.workers, batch_size=args.batch_size,
                                 use_cache=False, processes=args.processes)
        seconds = _timed(lambda s=settings: check_image_files(files, root=args.data, settings=s), args.repeats)
        rows[f"check {depth}"] = len(files) / seconds
    loader = [loader_decode_rate(files, device=args.device, workers=args.workers, batch_size=args.batch_size)
              for _ in range(args.repeats)]
    rows["loader decode"] = max(steady for steady, _ in loader)
    rows["loader epoch incl. build"] = max(epoch for _, epoch in loader)
    result = {
        "command": "python -m benchmarks.check_speed " + " ".join(sys.argv[1:]),
        "data": str(args.data), "files": len(files), "megabytes": round(megabytes, 1), "device": args.device,
        "workers": args.workers, "batch_size": args.batch_size, "machine": platform.node(),
        "cpu_count": os.cpu_count(), "files_per_s": {k: round(v, 1) for k, v in rows.items()},
        "chunk_samples": decode_chunk(args.device),
        "inspect_processes": settings.inspect_processes(len(files)),
        "full_pass_vs_loader": round(rows["check full"] / rows["loader decode"], 3),
        "full_pass_vs_loader_epoch": round(rows["check full"] / rows["loader epoch incl. build"], 3),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "check_speed.json").write_text(json.dumps(result, indent=1) + "\n")
    _plot(result, args.out / "check_speed.png")
    print(json.dumps(result, indent=1))
    return result


def decode_chunk(device: str) -> int:
    from crossdali.common.check.decode import CHUNK_SAMPLES

    return CHUNK_SAMPLES[device]


def _plot(result: dict, path: Path) -> None:
    names, values = list(result["files_per_s"]), list(result["files_per_s"].values())
    bar_png(path, names, values, width=7, headroom=1.3, labels=[f"{v:,.0f}" for v in values],
            colors=["tab:green", "tab:orange", "tab:blue", "tab:cyan"], xlabel="files/s (higher is better)",
            title=f"crossdali check, {result['files']} JPEGs, {result['device']}, {result['workers']} threads")


if __name__ == "__main__":
    main(get_args_parser().parse_args())
