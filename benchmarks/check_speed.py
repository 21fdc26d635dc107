"""Files/s of `crossdali check`'s fast and full passes, next to the decode rate of the loader itself
(docs/benchmarks.md#check-speed).

    python -m benchmarks.check_speed                                   # CPU, small sample set
    python -m benchmarks.check_speed --size bench --device gpu --copies 8   # GPU, 65,560 files (results/latest)
    python -m benchmarks.check_speed --smoke --out /tmp/check_speed                 # tiny, CPU
    cd /tmp && PYTHONPATH=OLD:REPO python -m benchmarks.check_speed --fast-only ...   # OLD's crossdali, this script

``--fast-only`` times the fast pass (header walks: CPU work on every device) and nothing else: a
quick A/B of two trees' fast pass on any machine, e.g. OLD = ``git archive REV crossdali | tar x -C OLD``
(run outside the repository, so that ``crossdali`` is imported from OLD; the JSON names the folder it came from).

The target on a GPU: the full pass at >= 80 % of the loader's own decode rate (a DALI file reader
+ ``fn.decoders.image``, the classification val pipeline's decoder). The loader is timed twice:
its steady rate (after a warm-up batch) and one epoch from construction, pipeline build included,
which is what the check's timing includes too (it builds its own decoder). Both pipeline builds
are also timed alone, so the JSON gives each side's rate after its build too: on the 8,195-file
bench set the GPU build (seconds) takes longer than the decoding, and ``--copies N``
checks N symbolic-link copies of the set (N times the files, a data set closer to a real one's
size, page-cached). "full pass decoder alone" is the full pass's decoder over the same files with no
header reading before or beside it (what the header work costs): DALI's file reader on a GPU
(``decode_file_list``), names fed to ``fn.io.file.read`` on the CPU (``decode_files``). The cache
is off for every timed pass. Writes ``check_speed.json`` and ``check_speed.png`` under ``--out``
(default ``results/latest``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import gpu_name
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
    parser.add_argument("--depth", type=int, default=None,
                        help="batches in flight in the full pass (default: the checker's, per device)")
    parser.add_argument("--read-ahead", type=int, default=None,
                        help="files whose headers may be read ahead of the decoder (default: the checker's)")
    parser.add_argument("--copies", type=int, default=1,
                        help="check and load N symbolic-link copies of every file (a larger data set)")
    parser.add_argument("--hw-decoder-load", type=float, default=None,
                        help="the GPU decoder's hardware JPEG share, for the check and the loader alike "
                             "(default: DALI's)")
    parser.add_argument("--profile", action="store_true",
                        help="after the timed runs, one more full pass under cProfile (the main thread, where the "
                             "pass is bound on a GPU): its top functions in check_full_profile.txt under --out")
    parser.add_argument("--timeline", action="store_true",
                        help="one more untimed full pass and decoder-alone pass each, recording when the decoder's "
                             "build starts and ends and when each chunk is done (seconds from the call): "
                             "timeline.json under --out")
    parser.add_argument("--fast-only", action="store_true",
                        help="time the fast pass only (header walks, CPU work): fast_pass.json under --out")
    parser.add_argument("--smoke", action="store_true", help="tiny set, one repeat (CI)")
    parser.add_argument("--out", type=Path, default=Path("results/latest"))
    return parser


def loader_decode_rate(files: list[str], *, device: str, workers: int, batch_size: int) -> tuple[float, float, float]:
    """Images/s of a DALI file reader + image decoder over ``files``: (one epoch after a warm-up
    batch, one epoch timed from the pipeline's construction, the seconds of the build alone)."""
    from nvidia.dali import fn, pipeline_def, types

    from crossdali.common.data.check.decode import GPU_DECODER_ARGS

    gpu = device == "gpu"

    @pipeline_def(batch_size=batch_size, num_threads=workers, device_id=0 if gpu else None)
    def decode():
        jpegs, _ = fn.readers.file(files=files, name="Reader")
        return fn.decoders.image(jpegs, device="mixed" if gpu else "cpu", output_type=types.RGB,
                                 **(GPU_DECODER_ARGS if gpu else {}))

    batches = -(-len(files) // batch_size)
    built = time.perf_counter()
    pipe = decode()
    pipe.build()
    build_seconds = time.perf_counter() - built
    pipe.run()
    timed = max(1, batches - 1)  # the rest of the epoch (one batch more on a one-batch set)
    start = time.perf_counter()
    for _ in range(timed):
        pipe.run()
    end = time.perf_counter()
    return timed * batch_size / (end - start), (timed + 1) * batch_size / (end - built), build_seconds


def _decoder_alone(files: list[str], args: argparse.Namespace) -> dict:
    from crossdali.common.data.check import core, decode

    decode_fn = decode.decode_file_list if args.device in core.FILE_READER_DEVICES else decode.decode_files
    return decode_fn(files, device=args.device, batch_size=args.batch_size, threads=args.workers)


def check_build_seconds(files: list[str], *, device: str, workers: int, batch_size: int) -> float:
    """Seconds to build the full pass's decoder alone (DALI's file reader over ``files`` on a GPU,
    the pipelined names-fed decoder on the CPU)."""
    from crossdali.common.data.check import core, decode

    start = time.perf_counter()
    if device in core.FILE_READER_DEVICES:
        decode._reader_pipeline(files, device=device, batch_size=batch_size, threads=workers,
                                depth=decode.PIPELINE_DEPTH[device])
    else:
        decode._PipelinedDecoder(device=device, batch_size=batch_size, threads=workers, source="paths").build()
    return time.perf_counter() - start


def symlink_copies(files: list[str], copies: int, folder: Path) -> list[str]:
    """``files`` then ``copies - 1`` more lists of symbolic links to them under ``folder``."""
    out = list(files)
    for c in range(1, copies):
        sub = folder / f"copy{c}"
        sub.mkdir(parents=True, exist_ok=True)
        for i, f in enumerate(files):
            link = sub / f"{i:07d}{Path(f).suffix}"
            link.symlink_to(os.path.abspath(f))
            out.append(str(link))
    return out


def _timed(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main(args: argparse.Namespace) -> dict:
    from crossdali.common.data.check import core as core_module
    from crossdali.common.data.check.core import CheckSettings, check_image_files
    from crossdali.common.data.sources import scan_image_folder

    if args.smoke:
        args.size, args.repeats = "tiny", 1
    from crossdali.common.data.check import decode

    if args.chunk:
        decode.CHUNK_SAMPLES[args.device] = args.chunk
    if args.depth:
        decode.PIPELINE_DEPTH[args.device] = args.depth
    if args.read_ahead:
        core_module.HEADER_READ_AHEAD = args.read_ahead
    if args.hw_decoder_load is not None:
        decode.GPU_DECODER_ARGS["hw_decoder_load"] = args.hw_decoder_load
    if args.data is None:
        from crossdali.common.data.sample_data import ensure_classification

        args.data = ensure_classification(size=args.size, formats=("imagefolder",)) / "imagefolder" / "train"
    files = list(scan_image_folder(args.data, validate=False).files)
    links = tempfile.TemporaryDirectory(prefix="check-speed-copies-")  # not under --out: results only
    if args.copies > 1:
        files = symlink_copies(files, args.copies, Path(links.name))
    megabytes = sum(os.path.getsize(f) for f in files) / 2**20
    run = {"command": "python -m benchmarks.check_speed " + " ".join(sys.argv[1:]), "data": str(args.data),
           "files": len(files), "megabytes": round(megabytes, 1), "device": args.device, "gpu": gpu_name(),
           "workers": args.workers, "batch_size": args.batch_size, "machine": platform.node(), "cpu_count": os.cpu_count(),
           "copies": args.copies}
    rows = {}
    for depth in ("fast",) if args.fast_only else ("fast", "full"):
        settings = CheckSettings(depth=depth, device=args.device, threads=args.workers, batch_size=args.batch_size,
                                 use_cache=False, processes=args.processes)
        seconds = _timed(lambda s=settings: check_image_files(files, root=args.data, settings=s), args.repeats)
        rows[f"check {depth}"] = len(files) / seconds
    if args.fast_only:  # the A/B of two trees' header walks (module docstring): which crossdali ran it
        import crossdali

        links.cleanup()
        return _write(args.out / "fast_pass.json", run | {"crossdali": str(Path(crossdali.__file__).parent),
                                                         "repeats": args.repeats, "files_per_s": _rounded(rows)})
    # The full pass's decoder alone on the same files, no header inspection before or beside it:
    # what the full pass would reach if reading headers cost nothing.
    rows["full pass decoder alone"] = len(files) / _timed(lambda: _decoder_alone(files, args), args.repeats)
    full_seconds = len(files) / rows["check full"]
    if args.profile:
        _profile_full_pass(files, args, settings, args.out / "check_full_profile.txt")
    if args.timeline:
        _timelines(files, args, settings, args.out / "timeline.json")
    loader = [loader_decode_rate(files, device=args.device, workers=args.workers, batch_size=args.batch_size)
              for _ in range(args.repeats)]
    rows["loader decode"] = max(steady for steady, _, _ in loader)
    rows["loader epoch incl. build"] = max(epoch for _, epoch, _ in loader)
    build = {"check full pass": min(check_build_seconds(files, device=args.device, workers=args.workers,
                                                        batch_size=args.batch_size) for _ in range(args.repeats)),
             "loader": min(b for _, _, b in loader)}
    after_build = len(files) / max(1e-9, full_seconds - build["check full pass"])
    result = run | {
        "files_per_s": _rounded(rows),
        "chunk_samples": decode.CHUNK_SAMPLES[args.device],
        "pipeline_depth": decode.PIPELINE_DEPTH[args.device],
        "header_read_ahead": core_module.HEADER_READ_AHEAD,
        "inspect_processes": settings.inspect_processes(len(files)),
        "full_pass_vs_loader": round(rows["check full"] / rows["loader decode"], 3),
        "full_pass_vs_loader_epoch": round(rows["check full"] / rows["loader epoch incl. build"], 3),
        "build_seconds": {k: round(v, 3) for k, v in build.items()},
        "check_full_after_build": round(after_build, 1),
        "full_pass_after_build_vs_loader": round(after_build / rows["loader decode"], 3),
        "gpu_decoder_args": dict(decode.GPU_DECODER_ARGS),
    }
    links.cleanup()
    _plot(_write(args.out / "check_speed.json", result), args.out / "check_speed.png")
    return result


def _rounded(rows: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 1) for k, v in rows.items()}


def _write(path: Path, result: dict) -> dict:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return result


def _profile_full_pass(files: list[str], args: argparse.Namespace, settings, path: Path) -> None:
    """One untimed full pass under cProfile (main thread only); the 40 functions with the most own
    time and the 30 with the most cumulative time, as text."""
    import cProfile
    import io
    import pstats

    from crossdali.common.data.check.core import check_image_files

    profiler = cProfile.Profile()
    profiler.runcall(check_image_files, files, root=args.data, settings=settings)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(40)
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(30)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.getvalue())


def _timelines(files: list[str], args: argparse.Namespace, settings, path: Path) -> None:
    """Where a pass's seconds go: the decoder's build, every chunk of the streaming decoder and, for
    the file reader's pass, when decoding starts (every header read), timestamped from the call (the
    checker's own functions wrapped for one pass each; nothing is changed in what they do)."""
    from crossdali.common.data.check import core, decode
    from crossdali.common.data.check.core import check_image_files

    events: list[tuple[str, float]] = []
    start = [0.0]
    build, run_chunk = decode._PipelinedDecoder.build, decode._PipelinedDecoder.run_chunk
    reader_pipeline, file_list = decode._reader_pipeline, core.decode_file_list

    def stamp(what: str) -> None:
        events.append((what, time.perf_counter() - start[0]))

    def timed_build(self):
        stamp("build start")
        build(self)
        stamp("build end")

    def timed_reader(*a, **k):
        stamp("build start")
        pipe = reader_pipeline(*a, **k)
        stamp("build end")
        return pipe

    def timed_file_list(*a, **k):
        stamp("headers done")
        return file_list(*a, **k)

    def timed_chunk(self, batches):
        outcome = run_chunk(self, batches)
        stamp("chunk")
        return outcome

    passes = {"check full": lambda: check_image_files(files, root=args.data, settings=settings),
              "full pass decoder alone": lambda: _decoder_alone(files, args)}
    out = {}
    decode._PipelinedDecoder.build, decode._PipelinedDecoder.run_chunk = timed_build, timed_chunk
    decode._reader_pipeline, core.decode_file_list = timed_reader, timed_file_list
    try:
        for name, run in passes.items():
            events.clear()
            start[0] = time.perf_counter()
            run()
            total = time.perf_counter() - start[0]
            chunks = [t for what, t in events if what == "chunk"]
            marks = {what: round(t, 3) for what, t in events if what != "chunk"}
            out[name] = {"seconds": round(total, 3), **marks,
                         "first_chunk_done": round(chunks[0], 3) if chunks else None,
                         "last_chunk_done": round(chunks[-1], 3) if chunks else None,
                         "after_last_chunk": round(total - chunks[-1], 3) if chunks else None,
                         "chunk_seconds": [round(b - a, 4) for a, b in zip(chunks, chunks[1:])]}
    finally:
        decode._PipelinedDecoder.build, decode._PipelinedDecoder.run_chunk = build, run_chunk
        decode._reader_pipeline, core.decode_file_list = reader_pipeline, file_list
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")


def _plot(result: dict, path: Path) -> None:
    names, values = list(result["files_per_s"]), list(result["files_per_s"].values())
    bar_png(path, names, values, width=7, headroom=1.3, labels=[f"{v:,.0f}" for v in values],
            colors=["tab:green", "tab:orange", "tab:olive", "tab:blue", "tab:cyan"], xlabel="files/s (higher is better)",
            title=f"crossdali check, {result['files']} JPEGs, {result.get('gpu') or result['device']}, "
                  f"{result['workers']} threads")


if __name__ == "__main__":
    main(get_args_parser().parse_args())
