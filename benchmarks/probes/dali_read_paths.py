"""Where the full pass of ``crossdali check`` loses to the loader when nothing else runs: DALI's
GPU decode rate over the same files through each way of getting the files into the pipeline.

    python -m benchmarks.probes.dali_read_paths --copies 8 --out /tmp/read_paths     # GPU only, 65,560 files

The full pass's timeline (``check_speed --timeline``) shows its decoder alone below the loader's
steady rate between chunks, with no header work beside it (docs/data-checks.md). The rows, each the
steady rate over one epoch after its first batch (rounds alternate, so a noisy machine shows in every row alike):

* ``file reader``: ``fn.readers.file(files=...)``, the loader's way (mmap'ed reads by its own thread);
* ``file reader, no mmap``: the same with ``dont_use_mmap=True`` (plain reads, as ``fn.io.file.read``);
* ``names fed, depth D``: the checker's way (``external_source`` fed one NUL-padded array of names
  per batch with ``feed_input``, ``fn.io.file.read`` in DALI's threads), the batches built before
  timing, D batches in flight;
* ``names by callback``: the same names, but DALI pulls them (``external_source(source=...)``) and
  prefetches as a reader does.

Writes ``read_paths.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import usage_error


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, default=8, help="symbolic-link copies of the bench set (8: 65,560 files)")
    parser.add_argument("-j", "--workers", type=int, default=16)
    parser.add_argument("-b", "--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cpu", action="store_true", help="decode on the CPU (a smoke run of this script, not the question)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/read_paths"))
    return parser


DEVICE = {"decoder": "mixed", "device_id": 0}


def _decode(encoded, types, fn):
    return fn.decoders.image(encoded, device=DEVICE["decoder"], output_type=types.RGB)


def _run_epoch(pipe_def, batches: int, batch_size: int) -> tuple[float, float]:
    """(steady files/s over ``batches`` after the first, build seconds) of a pipeline that runs itself."""
    start = time.perf_counter()
    pipe = pipe_def()
    pipe.build()
    build = time.perf_counter() - start
    pipe.run()
    start = time.perf_counter()
    for _ in range(batches - 1):
        pipe.run()
    return (batches - 1) * batch_size / (time.perf_counter() - start), build


def reader_rate(files: list[str], *, batches: int, args, mmap: bool = True) -> tuple[float, float]:
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=args.batch_size, num_threads=args.workers, device_id=DEVICE["device_id"])
    def pipe_def():
        jpegs, _ = fn.readers.file(files=files, dont_use_mmap=not mmap)
        return _decode(jpegs, types, fn)

    return _run_epoch(pipe_def, batches, args.batch_size)


def fed_rate(name_batches: list, *, args, depth: int) -> tuple[float, float]:
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=args.batch_size, num_threads=args.workers, device_id=DEVICE["device_id"],
                  prefetch_queue_depth=depth)
    def pipe_def():
        names = fn.external_source(name="names", dtype=types.UINT8, ndim=1)
        return _decode(fn.io.file.read(names), types, fn)

    start = time.perf_counter()
    pipe = pipe_def()
    pipe.build()
    build = time.perf_counter() - start
    it = iter(name_batches)
    for batch in (next(it) for _ in range(depth)):
        pipe.feed_input("names", batch)
    pipe.schedule_run()
    in_flight, done, timed_from = depth, 0, None
    while in_flight:
        pipe.share_outputs()
        pipe.release_outputs()
        in_flight -= 1
        done += 1
        if done == 1:
            timed_from = time.perf_counter()
        batch = next(it, None)
        if batch is not None:
            pipe.feed_input("names", batch)
            pipe.schedule_run()
            in_flight += 1
    return (done - 1) * args.batch_size / (time.perf_counter() - timed_from), build


def callback_rate(name_batches: list, *, args) -> tuple[float, float]:
    from nvidia.dali import fn, pipeline_def, types

    def source(info):
        if info.iteration >= len(name_batches):
            raise StopIteration
        return name_batches[info.iteration]

    @pipeline_def(batch_size=args.batch_size, num_threads=args.workers, device_id=DEVICE["device_id"])
    def pipe_def():
        names = fn.external_source(source=source, batch=True, batch_info=True, dtype=types.UINT8, ndim=1)
        return _decode(fn.io.file.read(names), types, fn)

    return _run_epoch(pipe_def, len(name_batches), args.batch_size)


def main(args: argparse.Namespace) -> dict:
    from benchmarks.check_speed import symlink_copies
    from crossdali.common.data.check.decode import _names_batch, gpu_available
    from crossdali.common.data.sample_data import ensure_classification
    from crossdali.common.data.sources import scan_image_folder

    if args.cpu:
        DEVICE.update(decoder="cpu", device_id=None)
    elif not gpu_available():
        raise usage_error("no CUDA GPU here: this compares DALI's GPU decode paths (--cpu: a smoke run)")
    root = ensure_classification(size="tiny" if args.cpu else "bench", formats=("imagefolder",)) / "imagefolder" / "train"
    files = list(scan_image_folder(root, validate=False).files)
    links = tempfile.TemporaryDirectory(prefix="read-paths-")
    files = symlink_copies(files, args.copies, Path(links.name))
    batches = len(files) // args.batch_size  # whole batches only: every row decodes the same files
    files = files[:batches * args.batch_size]
    name_batches = [_names_batch([f.encode() for f in files[i:i + args.batch_size]])
                    for i in range(0, len(files), args.batch_size)]
    rows: dict[str, list[float]] = {}
    builds: dict[str, list[float]] = {}
    variants = {
        "file reader": lambda: reader_rate(files, batches=batches, args=args),
        "file reader, no mmap": lambda: reader_rate(files, batches=batches, args=args, mmap=False),
        "names fed, depth 2": lambda: fed_rate(name_batches, args=args, depth=2),
        "names fed, depth 4": lambda: fed_rate(name_batches, args=args, depth=4),
        "names by callback": lambda: callback_rate(name_batches, args=args),
    }
    for _ in range(args.rounds):
        for name, run in variants.items():
            rate, build = run()
            rows.setdefault(name, []).append(round(rate, 1))
            builds.setdefault(name, []).append(round(build, 3))
            print(f"{name}: {rate:,.0f} files/s (build {build:.2f} s)", flush=True)
    links.cleanup()
    result = {"command": "python -m benchmarks.probes.dali_read_paths " + " ".join(sys.argv[1:]),
              "files": len(files), "batch_size": args.batch_size, "workers": args.workers,
              "steady_files_per_s": rows, "build_seconds": builds}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "read_paths.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main(get_args_parser().parse_args())
