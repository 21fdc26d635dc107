"""Decoded video frames/s: DALI on the GPU (NVDEC) against CPU decoders, plus DALI optical flow.

    python -m benchmarks.video_decode --out results/          # on the GPU machine, about 4-5 min
    python -m benchmarks.video_decode --out /tmp/vb --smoke   # any machine: tiny VP9 files, DALI CPU

It makes its own test videos first (real photos panning under a moving patch, H.264 in MP4,
1920x1080 and 1280x720, 25 fps, a key frame every 48 frames) with PyAV (libx264) when
``import av`` works, else with OpenCV's VideoWriter (H.264 if its FFmpeg build has an encoder,
else MPEG-4 part 2, and the JSON says which). Then, for each resolution:

- DALI ``fn.experimental.readers.video`` (device="gpu"): one reader; several reader instances
  in one pipeline (each a shard of the files); several pipelines in one process, run from
  threads. Clips of 16 consecutive frames, uint8 RGB on the GPU.
- DALI ``fn.decoders.video`` (device="mixed") on whole files read by ``fn.readers.file``: a batch
  of files decoded at once (no seeking; the first ``--decoder-frames`` frames of each file).
- CPU: PyAV and OpenCV, one stream (decoder threads on), and one stream per core in 16 processes
  (frames converted to RGB/BGR arrays, as DALI's are).
- ``fn.optical_flow`` on 8-frame sequences from the GPU reader: flow fields/s (decode included).

Each configuration runs for ``--seconds`` after a warm-up; every configuration is timed
separately, so the totals fit in about 5 minutes. Writes ``video_decode.json`` and
``video_decode.png`` into ``--out``. A configuration that fails is recorded with its error
and the run goes on.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import tempfile
import threading
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from fractions import Fraction
from pathlib import Path

import numpy as np

TARGET_1080P = 2500  # frames/s from one process (issue 6)
RESOLUTIONS = {"1080p": (1920, 1080), "720p": (1280, 720)}


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, add_help=add_help,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--work", type=Path, default=None, help="where the test videos go (default: a temp dir)")
    parser.add_argument("--files", type=int, default=14, help="test videos per resolution")
    parser.add_argument("--frames", type=int, default=144, help="frames per test video")
    parser.add_argument("--seconds", type=float, default=6.0, help="timed seconds per configuration")
    parser.add_argument("--budget-s", type=float, default=265.0, help="skip what is left after this many seconds")
    parser.add_argument("--readers", default="1,2,4,7", help="reader instances in one pipeline")
    parser.add_argument("--pipelines", default="4,7", help="pipelines in one process (threads)")
    parser.add_argument("--cpu-procs", type=int, default=os.cpu_count() or 16, help="processes for CPU decoding")
    parser.add_argument("--decoder-frames", type=int, default=48, help="frames per file for fn.decoders.video")
    parser.add_argument("--smoke", action="store_true",
                        help="check the script anywhere: 160x96 VP9 files, DALI on the CPU, 1 s per configuration")
    return parser


# ----------------------------------------------------------------------------- test videos

def _canvas(width: int, height: int, seed: int) -> np.ndarray:
    """A mosaic of real photos (scikit-image's), larger than the frame so a window can pan."""
    from PIL import Image

    from crossdali.common.sample_data.photos import CLASS_PHOTOS, load_photo

    rng = np.random.default_rng(seed)
    cw, ch = width + width // 3, height + height // 3
    canvas = np.zeros((ch, cw, 3), np.uint8)
    tile = max(cw, ch) // 3
    for y in range(0, ch, tile):
        for x in range(0, cw, tile):
            photo = load_photo(CLASS_PHOTOS[int(rng.integers(len(CLASS_PHOTOS)))])
            img = np.asarray(Image.fromarray(photo).resize((tile, tile), Image.BILINEAR))
            canvas[y : y + tile, x : x + tile] = img[: ch - y, : cw - x]
    return canvas


def _frames(width: int, height: int, n: int, seed: int):
    canvas = _canvas(width, height, seed)
    ch, cw = canvas.shape[:2]
    patch = canvas[: height // 4, : width // 4].copy()
    ph, pw = patch.shape[:2]
    for i in range(n):
        t = i / max(1, n - 1)
        y0, x0 = int(t * (ch - height)), int((1 - t) * (cw - width))
        frame = canvas[y0 : y0 + height, x0 : x0 + width].copy()
        py, px = int((height - ph) * t), int((width - pw) * (0.5 + 0.4 * np.sin(6 * t)))
        frame[py : py + ph, px : px + pw] = patch
        yield frame


def _write_with_av(path: Path, width: int, height: int, n: int, seed: int, codec: str) -> str:
    import av

    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264" if codec == "h264" else "libvpx-vp9", rate=25)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.time_base = Fraction(1, 25)
        if codec == "h264":
            stream.options = {"preset": "veryfast", "crf": "23", "g": "48", "bf": "2", "threads": "4"}
        else:
            stream.options = {"crf": "32", "b:v": "0", "deadline": "realtime", "cpu-used": "8", "g": "48"}
        for i, frame in enumerate(_frames(width, height, n, seed)):
            vf = av.VideoFrame.from_ndarray(frame, format="rgb24")
            vf.pts, vf.time_base = i, Fraction(1, 25)
            for packet in stream.encode(vf):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return codec


def _write_with_cv2(path: Path, width: int, height: int, n: int, seed: int) -> str:
    import cv2

    for fourcc, codec in (("avc1", "h264"), ("H264", "h264"), ("mp4v", "mpeg4")):
        writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), 25, (width, height))
        if writer.isOpened():
            for frame in _frames(width, height, n, seed):
                writer.write(frame[..., ::-1])
            writer.release()
            if path.stat().st_size > 0:
                return codec
        writer.release()
    raise RuntimeError("OpenCV can write neither H.264 nor MPEG-4 here, and PyAV is missing: stage av")


def _write_one(job) -> str:
    path, width, height, n, seed, codec, use_av = job
    if use_av:
        return _write_with_av(Path(path), width, height, n, seed, codec)
    return _write_with_cv2(Path(path), width, height, n, seed)


def make_videos(folder: Path, width: int, height: int, *, files: int, frames: int, codec: str) -> tuple[list[str], str, str]:
    """Encode ``files`` test videos; returns (paths, codec written, encoder used)."""
    try:
        import av  # noqa: F401

        use_av = True
    except ImportError:
        use_av = False
    if not use_av and codec != "h264":
        raise RuntimeError("VP9 test videos need PyAV")
    folder.mkdir(parents=True, exist_ok=True)
    ext = ".mp4" if codec == "h264" else ".webm"
    jobs = [(str(folder / f"v{i:02d}{ext}"), width, height, frames, i, codec, use_av) for i in range(files)]
    workers = max(1, min(len(jobs), (os.cpu_count() or 4) // 2))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        written = list(pool.map(_write_one, jobs))
    return [j[0] for j in jobs], written[0], "pyav" if use_av else "opencv"


# ----------------------------------------------------------------------------- timing helpers

def _timed(step, *, seconds: float, warmup: int = 3) -> tuple[int, float]:
    """Call ``step()`` (returns frames done) for ``seconds`` after ``warmup`` calls."""
    for _ in range(warmup):
        step()
    frames, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        frames += step()
    return frames, time.perf_counter() - start


def _reader_pipeline(files, *, device: str, instances: int, batch: int, seq: int, threads: int, seed: int = 0,
                     shard_offset: int = 0, total_shards: int | None = None):
    from nvidia.dali import fn, pipeline_def

    total = total_shards or instances

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=0 if device == "gpu" else None, seed=seed,
                  prefetch_queue_depth=2)
    def pipe():
        outs = []
        for i in range(instances):
            outs.append(fn.experimental.readers.video(
                device=device, filenames=files, sequence_length=seq, step=seq, shard_id=shard_offset + i,
                num_shards=total, random_shuffle=False, name=f"Reader{i}"))
        return tuple(outs)

    p = pipe()
    p.build()
    return p


def bench_reader(files, *, device: str, instances: int, seconds: float, batch: int = 4, seq: int = 16) -> dict:
    p = _reader_pipeline(files, device=device, instances=instances, batch=batch, seq=seq,
                         threads=min(16, 2 + instances))
    frames, elapsed = _timed(lambda: (p.run(), instances * batch * seq)[1], seconds=seconds)
    return {"frames": frames, "seconds": elapsed}


def bench_pipelines(files, *, device: str, count: int, seconds: float, batch: int = 4, seq: int = 16) -> dict:
    pipes = [_reader_pipeline(files, device=device, instances=1, batch=batch, seq=seq, threads=2,
                              shard_offset=i, total_shards=count) for i in range(count)]
    for p in pipes:  # warm-up
        p.run()
    done = [0] * count
    stop = threading.Event()

    def loop(i: int) -> None:
        while not stop.is_set():
            pipes[i].run()
            done[i] += batch * seq

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(count)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return {"frames": sum(done), "seconds": elapsed}


def bench_decoder(files, *, device: str, batch: int, frames_per_file: int, seconds: float) -> dict:
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=batch, num_threads=4, device_id=0 if device == "gpu" else None, prefetch_queue_depth=2)
    def pipe():
        encoded, _ = fn.readers.file(files=files, random_shuffle=False, name="Files")
        return fn.decoders.video(encoded, device="mixed" if device == "gpu" else "cpu",
                                 sequence_length=frames_per_file)

    p = pipe()
    p.build()
    frames, elapsed = _timed(lambda: (p.run(), batch * frames_per_file)[1], seconds=seconds, warmup=2)
    return {"frames": frames, "seconds": elapsed}


def bench_optical_flow(files, *, seconds: float, batch: int = 4, seq: int = 8, preset: float = 0.5) -> dict:
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=batch, num_threads=4, device_id=0, prefetch_queue_depth=2)
    def pipe():
        frames = fn.experimental.readers.video(device="gpu", filenames=files, sequence_length=seq, step=seq,
                                               name="Reader")
        return fn.optical_flow(frames, output_grid=4, preset=preset, enable_temporal_hints=True)

    p = pipe()
    p.build()
    fields, elapsed = _timed(lambda: (p.run(), batch * (seq - 1))[1], seconds=seconds, warmup=2)
    return {"frames": fields, "seconds": elapsed, "unit": "flow fields (frame pairs), decode included"}


def _cpu_decode_file(job) -> int:
    """Decode one file to RGB arrays on the CPU; returns frames decoded (runs in a worker process)."""
    lib, path, threads, limit_s = job
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < limit_s:  # loop over the file until the time is up
        if lib == "pyav":
            import av

            with av.open(path) as c:
                stream = c.streams.video[0]
                stream.thread_type = "AUTO" if threads > 1 else "SLICE"
                stream.thread_count = threads
                for frame in c.decode(stream):
                    frame.to_ndarray(format="rgb24")
                    n += 1
        else:
            import cv2

            cv2.setNumThreads(threads)
            cap = cv2.VideoCapture(path)
            if not cap.isOpened():
                raise RuntimeError(f"OpenCV cannot open {path}")
            while True:
                ok, _ = cap.read()
                if not ok:
                    break
                n += 1
            cap.release()
    return n


def _warm_worker(lib: str) -> None:
    __import__("av" if lib == "pyav" else "cv2")
    time.sleep(0.2)  # keep this worker busy so that every worker gets one


def bench_cpu(files, *, lib: str, procs: int, seconds: float) -> dict:
    if procs == 1:
        start = time.perf_counter()
        n = _cpu_decode_file((lib, files[0], os.cpu_count() or 1, seconds))
        return {"frames": n, "seconds": time.perf_counter() - start, "threads": os.cpu_count()}
    jobs = [(lib, files[i % len(files)], 1, seconds) for i in range(procs)]
    # spawn, not fork: this process holds a CUDA context and DALI's threads
    with ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_warm_worker, [lib] * procs))  # interpreter start and imports stay out of the timing
        start = time.perf_counter()
        n = sum(pool.map(_cpu_decode_file, jobs))
        elapsed = time.perf_counter() - start
    return {"frames": n, "seconds": elapsed, "processes": procs}


# ----------------------------------------------------------------------------- main

def _environment() -> dict:
    env = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}
    try:
        import nvidia.dali as dali
        from nvidia.dali.backend import GetCUDADeviceCount

        env["dali"] = dali.__version__
        env["cuda_gpus"] = GetCUDADeviceCount()
    except ImportError:
        env["dali"] = None
    for mod in ("av", "cv2", "torch"):
        try:
            env[mod] = __import__(mod).__version__
        except ImportError:
            env[mod] = None
    try:
        import torch

        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return env


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results if r.get("fps")]
    if not ok:
        return
    groups = list(dict.fromkeys(r["resolution"] for r in ok))
    fig, axes = plt.subplots(1, len(groups), figsize=(7 * len(groups), 0.45 * max(
        sum(r["resolution"] == g for r in ok) for g in groups) + 2), squeeze=False)
    for ax, g in zip(axes[0], groups, strict=True):
        rows = [r for r in ok if r["resolution"] == g]
        colors = ["tab:green" if r["kind"] == "dali-gpu" else "tab:purple" if r["kind"] == "optical-flow"
                  else "tab:blue" if r["kind"] == "dali-cpu" else "tab:gray" for r in rows]
        ax.barh([r["name"] for r in rows], [r["fps"] for r in rows], color=colors)
        for i, r in enumerate(rows):
            ax.text(r["fps"], i, f" {r['fps']:,.0f}", va="center", fontsize=8)
        if g == "1080p":
            ax.axvline(TARGET_1080P, color="red", ls="--", lw=1, label=f"target {TARGET_1080P:,} frames/s")
            ax.legend(loc="lower right", fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("frames/s (optical flow: flow fields/s)")
        ax.set_title(f"{g} H.264 decode" if g != "smoke" else "smoke run (VP9, CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(args: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="crossdali_video_bench_"))
    env = _environment()
    print(json.dumps(env), flush=True)
    device = "cpu" if args.smoke else "gpu"
    resolutions = {"smoke": (160, 96)} if args.smoke else RESOLUTIONS
    seconds = 1.0 if args.smoke else args.seconds
    results: list[dict] = []
    videos_meta = {}

    def run(name: str, resolution: str, kind: str, fn, **kw) -> None:
        elapsed_total = time.perf_counter() - t0
        row = {"name": name, "resolution": resolution, "kind": kind}
        if elapsed_total > args.budget_s:
            row["skipped"] = f"time budget of {args.budget_s:.0f} s used up"
        else:
            try:
                row |= fn(**kw)
                row["fps"] = row["frames"] / row["seconds"]
            except Exception as e:  # record and go on: the run is unattended
                row["error"] = f"{type(e).__name__}: {e}"[:2000]
                traceback.print_exc()
        results.append(row)
        shown = f"{row['fps']:,.0f} frames/s" if "fps" in row else row.get("error") or row.get("skipped")
        print(f"[{time.perf_counter() - t0:6.1f} s] {resolution:6s} {name:42s} {shown}", flush=True)

    readers = [int(x) for x in args.readers.split(",") if x]
    pipelines = [int(x) for x in args.pipelines.split(",") if x]
    for res, (w, h) in resolutions.items():
        start = time.perf_counter()
        codec = "vp9" if args.smoke else "h264"
        n_files = 4 if args.smoke else args.files
        n_frames = 48 if args.smoke else args.frames
        try:
            files, written, encoder = make_videos(work / res, w, h, files=n_files, frames=n_frames, codec=codec)
        except Exception as e:
            results.append({"name": "make test videos", "resolution": res, "error": f"{type(e).__name__}: {e}"})
            traceback.print_exc()
            continue
        videos_meta[res] = {"files": len(files), "frames_per_file": n_frames, "width": w, "height": h,
                            "codec": written, "encoder": encoder, "seconds_to_make": time.perf_counter() - start,
                            "bytes": sum(Path(f).stat().st_size for f in files)}
        print(f"[{time.perf_counter() - t0:6.1f} s] {res}: {len(files)} x {n_frames} frames {written} "
              f"({encoder}) in {time.perf_counter() - start:.1f} s", flush=True)
        kind = "dali-gpu" if device == "gpu" else "dali-cpu"
        for k in readers:
            run(f"DALI reader x{k} (one pipeline)", res, kind, bench_reader, files=files, device=device,
                instances=k, seconds=seconds)
        for k in pipelines:
            run(f"DALI pipelines x{k} (threads, one process)", res, kind, bench_pipelines, files=files,
                device=device, count=k, seconds=seconds)
        run(f"DALI decoders.video batch 7 ({args.decoder_frames} fr/file)", res, kind, bench_decoder, files=files,
            device=device, batch=7, frames_per_file=min(args.decoder_frames, n_frames), seconds=seconds)
        if not args.smoke:
            run("optical flow (reader + fn.optical_flow)", res, "optical-flow", bench_optical_flow, files=files,
                seconds=seconds)
        for lib in ("pyav", "opencv"):
            if env.get("av" if lib == "pyav" else "cv2") is None:
                continue
            run(f"{lib} CPU, 1 stream", res, "cpu", bench_cpu, files=files, lib=lib, procs=1, seconds=seconds)
            run(f"{lib} CPU, {args.cpu_procs} processes", res, "cpu", bench_cpu, files=files, lib=lib,
                procs=args.cpu_procs, seconds=seconds)

    best_1080 = max((r["fps"] for r in results if r.get("resolution") == "1080p" and r.get("kind") == "dali-gpu"
                     and "fps" in r), default=None)
    best_cpu_1080 = max((r["fps"] for r in results if r.get("resolution") == "1080p" and r.get("kind") == "cpu"
                         and "fps" in r), default=None)
    report = {"benchmark": "video_decode", "environment": env, "videos": videos_meta, "seconds_per_config": seconds,
              "target_1080p_frames_per_s": TARGET_1080P, "best_dali_gpu_1080p": best_1080,
              "best_cpu_1080p": best_cpu_1080,
              "target_met": None if best_1080 is None else best_1080 >= TARGET_1080P,
              "total_seconds": time.perf_counter() - t0, "results": results}
    (args.out / "video_decode.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(results, args.out / "video_decode.png")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {args.out / 'video_decode.json'} and video_decode.png in {time.perf_counter() - t0:.0f} s; "
          f"best DALI GPU 1080p: {best_1080}", flush=True)
    return report


if __name__ == "__main__":
    main(get_args_parser().parse_args())
