"""Decoded video frames/s: DALI on the GPU (NVDEC) against the other GPU decoders and the CPU.

    python -m benchmarks.video_decode                         # on a GPU machine, minutes: results/latest
    python -m benchmarks.video_decode --out results/x264 --encode x264-default --resolutions 1080p
    python -m benchmarks.video_decode --out /tmp/vb --smoke   # any machine: tiny VP9 files, DALI CPU

It makes its own test videos first (real photos panning under a moving patch, H.264 in MP4,
1920x1080 and 1280x720, 25 fps) with PyAV (libx264); it stops at once without PyAV, which crossdali's
video loader also needs (it counts each file's clips with it).
``--encode`` picks the x264 settings (``ENCODES``): ``gop48`` (a key frame every 48 frames, what a
set re-encoded for training looks like) or ``x264-default`` (what cameras and the web produce). Then,
at each resolution (1080p the whole sweep, 720p the best configurations):

- DALI ``fn.experimental.readers.video`` (device="gpu", crossdali's reader): 1 to 14 reader
  instances in one pipeline (each a shard of the files), 48-frame clips, several pipelines in one
  process run from threads; DALI's legacy ``fn.readers.video`` (NVDEC only) the same way. Clips of
  16 consecutive frames, uint8 RGB on the GPU.
- crossdali's PyTorch clip loader as training runs it (random crop, flip, normalize, float16): one clip
  per read with one pipeline and with the shard split over 7 (``pipelines=``), several clips per read
  (``--read-rows``), and the training defaults (``--default-batches``: nothing passed but the batch).
- DALI ``fn.decoders.video`` (device="mixed") on whole files read by ``fn.readers.file``.
- Peers on the GPU, each in its own process (``benchmarks/video_peers.py``): NVIDIA's
  PyNvVideoCodec (``SimpleDecoder``, RGB output) and torchcodec's CUDA decoder (NVCUVID "beta" and
  FFmpeg NVDEC backends), from 1 to 14 threads; a peer that is not installed has no row.
- CPU: PyAV and OpenCV, one stream (decoder threads on), and one stream per core in 16 processes
  (frames converted to RGB/BGR arrays, as DALI's are).
- ``fn.optical_flow`` on 8-frame sequences from the GPU reader: flow fields/s (decode included).

Each row runs for ``--seconds`` after a warm-up and records, beside frames/s, the mean load of the
GPU's engines over its timed window (``nvidia-smi dmon -s u``: ``dec`` is NVDEC, ``sm`` the CUDA
cores; ``benchmarks/engine_load.py``) and the CPU cores the process kept busy. Writes
``video_decode.json``, ``video_decode.png`` and the raw ``video_decode_dmon.log`` into ``--out``. A
row that fails is recorded with its error and the run goes on.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import multiprocessing
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from fractions import Fraction
from pathlib import Path

import numpy as np

from benchmarks import usage_error
from crossdali.common.video import CPU_TRAIN_BATCH, GPU_TRAIN_BATCH

TARGET_1080P = 2500  # frames/s from one process: the project's target
RESOLUTIONS = {"1080p": (1920, 1080), "720p": (1280, 720)}
# x264 settings of the test videos. gop48: what a training set re-encoded for random access looks
# like (a key frame every 48 frames, 2 B-frames); x264-default: what a camera or web video usually is
# (x264's own defaults: preset medium, a key frame at most every 250 frames, 3 B-frames).
ENCODES = {
    "gop48": {"about": "veryfast, CRF 23, key frame every 48, 2 B-frames",
              "options": {"preset": "veryfast", "crf": "23", "g": "48", "bf": "2"}},
    "x264-default": {"about": "medium, CRF 23, key frame at most every 250, 3 B-frames",
                     "options": {"preset": "medium", "crf": "23"}},
    "gop16": {"about": "veryfast, CRF 23, a key frame every 16 frames (the clip length), 2 B-frames",
              "options": {"preset": "veryfast", "crf": "23", "g": "16", "keyint_min": "16", "bf": "2"}},
}


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, add_help=add_help,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results/latest"))
    parser.add_argument("--work", type=Path, default=None, help="where the test videos go (default: a temp dir)")
    parser.add_argument("--files", type=int, default=14, help="test videos per resolution")
    parser.add_argument("--frames", type=int, default=144, help="frames per test video")
    parser.add_argument("--seconds", type=float, default=6.0, help="timed seconds per configuration")
    parser.add_argument("--budget-s", type=float, default=480.0, help="skip what is left after this many seconds")
    parser.add_argument("--readers", default="1,4,7,14", help="reader instances in one pipeline")
    parser.add_argument("--pipelines", default="7", help="pipelines in one process (threads)")
    parser.add_argument("--cpu-procs", type=int, default=os.cpu_count() or 16, help="processes for CPU decoding")
    parser.add_argument("--decoder-frames", type=int, default=48, help="frames per file for fn.decoders.video")
    parser.add_argument("--encode", choices=sorted(ENCODES), default="gop48",
                        help="x264 settings of the test videos (PyAV): " + "; ".join(
                            f"{k}: {v['about']}" for k, v in sorted(ENCODES.items())))
    parser.add_argument("--resolutions", default="1080p,720p", help=f"of {', '.join(RESOLUTIONS)}")
    parser.add_argument("--only", action="append", default=[], metavar="SUBSTRING",
                        help="run only rows whose name contains SUBSTRING (repeat for more; row names hold commas)")
    parser.add_argument("--no-peers", dest="peers", action="store_false",
                        help="skip the PyNvVideoCodec and torchcodec rows")
    parser.add_argument("--peer-ld-path", default=os.environ.get("PEER_LD_PATH", ""),
                        help="LD_LIBRARY_PATH for the peer processes only (torchcodec needs FFmpeg's shared "
                             "libraries; default: $PEER_LD_PATH)")
    parser.add_argument("--loader-pipelines", default="1,4,7",
                        help="pipelines of the crossdali loader rows reading one clip at a time (train)")
    parser.add_argument("--read-rows", default="3x4,3x2", metavar="KxR,...",
                        help="crossdali loader rows with clips_per_read K and R reads per pipeline and step (P "
                             "--read-pipelines, so batches of P x R x K clips); 3 x 16 frames = the gop48 files' "
                             "key-frame interval")
    parser.add_argument("--read-pipelines", default="7", help="pipelines of the --read-rows loader rows")
    parser.add_argument("--default-batches", default=f"{GPU_TRAIN_BATCH},{CPU_TRAIN_BATCH}",
                        help="batches of the crossdali loader rows with the training defaults (clips_per_read and "
                             "pipelines left to the loader: 3 clips per read, one read per pipeline up to 14); "
                             f"{GPU_TRAIN_BATCH} is the training script's on a GPU. Each row runs in a process of "
                             "its own and records the GPU memory its loader took")
    parser.add_argument("--smoke", action="store_true",
                        help="check the script anywhere: 160x96 VP9 files, DALI on the CPU, 1 s per configuration")
    return parser


# ----------------------------------------------------------------------------- test videos

def _canvas(width: int, height: int, seed: int) -> np.ndarray:
    """A mosaic of real photos (scikit-image's), larger than the frame so a window can pan."""
    from PIL import Image

    from crossdali.common.data.sample_data.photos import CLASS_PHOTOS, load_photo

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


def _write_with_av(path: Path, width: int, height: int, n: int, seed: int, codec: str, encode: str) -> str:
    import av

    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264" if codec == "h264" else "libvpx-vp9", rate=25)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.time_base = Fraction(1, 25)
        if codec == "h264":
            stream.options = {**ENCODES[encode]["options"], "threads": "4"}
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


def _write_one(job) -> str:
    path, width, height, n, seed, codec, encode = job
    return _write_with_av(Path(path), width, height, n, seed, codec, encode)


def make_videos(folder: Path, width: int, height: int, *, files: int, frames: int, codec: str,
                encode: str = "gop48") -> tuple[list[str], str, str]:
    """Encode ``files`` test videos with PyAV; returns (paths, codec written, encoder used)."""
    folder.mkdir(parents=True, exist_ok=True)
    ext = ".mp4" if codec == "h264" else ".webm"
    jobs = [(str(folder / f"v{i:02d}{ext}"), width, height, frames, i, codec, encode) for i in range(files)]
    workers = max(1, min(len(jobs), (os.cpu_count() or 4) // 2))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        written = list(pool.map(_write_one, jobs))
    return [j[0] for j in jobs], written[0], "pyav"


# ----------------------------------------------------------------------------- timing helpers

def _window(frames: int, t0: float, cpu0) -> dict:
    """A row's result: frames, seconds, the window's perf_counter stamps (for the engine load) and
    the CPU seconds this process used in it (DALI's threads included)."""
    t1, cpu1 = time.perf_counter(), os.times()
    return {"frames": frames, "seconds": t1 - t0, "t0": t0, "t1": t1,
            "cpu_s": (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)}


def _timed(step, *, seconds: float, warmup: int = 3) -> dict:
    """Call ``step()`` (returns frames done) for ``seconds`` after ``warmup`` calls."""
    for _ in range(warmup):
        step()
    frames, cpu0, start = 0, os.times(), time.perf_counter()
    while time.perf_counter() - start < seconds:
        frames += step()
    return _window(frames, start, cpu0)


def _gpu_used_mib() -> float:
    """Memory in use on GPU 0, all processes (CUDA's view; creates this process's context first)."""
    import torch

    free, total = torch.cuda.mem_get_info(0)
    return (total - free) / 2**20


def in_own_process(row_fn, **kw) -> dict:
    """``row_fn(**kw)`` in a spawned process of its own (its memory is its own, its perf_counter stamps are
    comparable: CLOCK_MONOTONIC is system-wide)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(row_fn, **kw).result()


def _reader_pipeline(files, *, device: str, instances: int, batch: int, seq: int, threads: int, seed: int = 0,
                     shard_offset: int = 0, total_shards: int | None = None, legacy: bool = False,
                     shuffle: bool = False):
    from nvidia.dali import fn, pipeline_def, types

    total = total_shards or instances

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=0 if device == "gpu" else None, seed=seed,
                  prefetch_queue_depth=2)
    def pipe():
        outs = []
        for i in range(instances):
            shard = dict(filenames=files, sequence_length=seq, step=seq, shard_id=shard_offset + i, num_shards=total,
                         random_shuffle=shuffle, name=f"Reader{i}")
            if legacy:  # fn.readers.video: NVDEC only, its own decode thread per reader, no CPU backend
                # file_list_include_preceding_frame set as crossdali's reader sets it (it only matters for file
                # lists with timestamps); left out, DALI warns once per reader instance
                outs.append(fn.readers.video(device="gpu", dtype=types.UINT8, file_list_include_preceding_frame=True,
                                             **shard))
            else:
                outs.append(fn.experimental.readers.video(device=device, **shard))
        return tuple(outs)

    p = pipe()
    p.build()
    return p


def bench_reader(files, *, device: str, instances: int, seconds: float, batch: int = 4, seq: int = 16,
                 legacy: bool = False, shuffle: bool = False) -> dict:
    """``shuffle``: clips in random order (DALI's ``random_shuffle``, as training reads them), so most
    clips start with a seek to the key frame before them; otherwise each reader walks its files in order."""
    p = _reader_pipeline(files, device=device, instances=instances, batch=batch, seq=seq,
                         threads=min(16, 2 + instances), legacy=legacy, shuffle=shuffle)
    return _timed(lambda: (p.run(), instances * batch * seq)[1], seconds=seconds) | {"sequence_length": seq,
                                                                                     "shuffled": shuffle}


def bench_pipelines(files, *, device: str, count: int, seconds: float, batch: int = 4, seq: int = 16,
                    legacy: bool = False) -> dict:
    pipes = [_reader_pipeline(files, device=device, instances=1, batch=batch, seq=seq, threads=2,
                              shard_offset=i, total_shards=count, legacy=legacy) for i in range(count)]
    for p in pipes:  # warm-up
        p.run()
    done = [0] * count
    stop = threading.Event()

    def loop(i: int) -> None:
        while not stop.is_set():
            pipes[i].run()
            done[i] += batch * seq

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(count)]
    cpu0, start = os.times(), time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return _window(sum(done), start, cpu0)


def bench_loader(files, *, device: str, pipelines: int | None, seconds: float, batch: int = 28, seq: int = 16,
                 crop: int = 112, train: bool = True, clips_per_read: int | None = 1, memory: bool = False) -> dict:
    """crossdali's PyTorch clip loader as training uses it (train split: clips shuffled, random crop,
    flip, normalize, float16 NCFHW on the GPU), ``pipelines`` DALI pipelines merged per batch;
    ``train=False``: the val split (clips in file order, resize + center crop); ``clips_per_read``:
    that many consecutive clips decoded as one read (``batch`` counts clips). ``None`` for either: the
    loader's default, recorded as resolved. ``memory``: record ``gpu_loader_mib``, the GPU memory in use
    after the timed window less that before the loader was built (DALI keeps what it allocated, so this is
    its peak; only meaningful in a process of its own, ``in_own_process``)."""
    import torch

    used0 = _gpu_used_mib() if memory and device == "gpu" else None

    from crossdali.common.data.sources import DataSource
    from crossdali.pytorch.video import create_video_loader

    source = DataSource(format="filelist", root=Path(files[0]).parent, files=tuple(files),
                        labels=(0,) * len(files), num_samples=len(files))
    loader = create_video_loader(source, train=train, backend="dali-gpu" if device == "gpu" else "dali-cpu",
                                 batch_size=batch, sequence_length=seq, step=seq, crop_size=crop, workers=2,
                                 device_id=0 if device == "gpu" else None, dtype="float16", pipelines=pipelines,
                                 clips_per_read=clips_per_read)
    batches = iter(())

    def step() -> int:
        nonlocal batches
        clips = next(batches, None)
        if clips is None:  # the next epoch
            batches = iter(loader)
            clips = next(batches)
        if device == "gpu":
            torch.cuda.synchronize()
        return clips[0].shape[0] * seq

    row = _timed(step, seconds=seconds)
    if used0 is not None:
        row["gpu_loader_mib"] = round(_gpu_used_mib() - used0)
    return row | {"sequence_length": seq, "batch": batch, "crop": crop,
                                            "pipelines": loader.pipelines, "shuffled": train,
                                            "clips_per_read": loader.unfold,
                                            "defaults": [k for k, v in (("pipelines", pipelines),
                                                                        ("clips_per_read", clips_per_read)) if v is None]}


def bench_decoder(files, *, device: str, batch: int, frames_per_file: int, seconds: float) -> dict:
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=batch, num_threads=4, device_id=0 if device == "gpu" else None, prefetch_queue_depth=2)
    def pipe():
        encoded, _ = fn.readers.file(files=files, random_shuffle=False, name="Files")
        return fn.decoders.video(encoded, device="mixed" if device == "gpu" else "cpu",
                                 sequence_length=frames_per_file)

    p = pipe()
    p.build()
    return _timed(lambda: (p.run(), batch * frames_per_file)[1], seconds=seconds, warmup=2)


def bench_optical_flow(files, *, seconds: float, batch: int = 4, seq: int = 8, preset: float = 0.5) -> dict:
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=batch, num_threads=4, device_id=0, prefetch_queue_depth=2)
    def pipe():
        frames = fn.experimental.readers.video(device="gpu", filenames=files, sequence_length=seq, step=seq,
                                               name="Reader")
        return fn.optical_flow(frames, output_grid=4, preset=preset, enable_temporal_hints=True)

    p = pipe()
    p.build()
    return _timed(lambda: (p.run(), batch * (seq - 1))[1], seconds=seconds, warmup=2) | {
        "unit": "flow fields (frame pairs), decode included"}


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
        end = time.perf_counter()
        return {"frames": n, "seconds": end - start, "t0": start, "t1": end, "threads": os.cpu_count()}
    jobs = [(lib, files[i % len(files)], 1, seconds) for i in range(procs)]
    # spawn, not fork: this process holds a CUDA context and DALI's threads
    with ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_warm_worker, [lib] * procs))  # interpreter start and imports stay out of the timing
        start = time.perf_counter()
        n = sum(pool.map(_cpu_decode_file, jobs))
        end = time.perf_counter()
    return {"frames": n, "seconds": end - start, "t0": start, "t1": end, "processes": procs}


def bench_peer(files, *, peer: str, threads: int, seconds: float, backend: str = "beta", ld_path: str = "") -> dict:
    """A peer decoder (``benchmarks.video_peers``) in its own process; its JSON line is the row."""
    cmd = [sys.executable, "-m", "benchmarks.video_peers", "--peer", peer, "--threads", str(threads),
           "--seconds", str(seconds), "--backend", backend, *files]
    env = dict(os.environ)
    if ld_path:  # only here: DALI in this process keeps the FFmpeg it was built with
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [ld_path, env.get("LD_LIBRARY_PATH")]))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120, env=env,
                          cwd=Path(__file__).resolve().parents[1])
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"exit {proc.returncode}: {(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
    out = json.loads(lines[-1])
    if "error" in out:
        raise RuntimeError(out["error"])
    return out


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
                  else "tab:blue" if r["kind"] == "dali-cpu" else "tab:orange" if r["kind"] == "peer-gpu"
                  else "tab:gray" for r in rows]
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


def _peer_available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def row_plan(args: argparse.Namespace, res: str, files: list[str], n_frames: int, env: dict, device: str) -> list:
    """(name, kind, function, keyword arguments) of every row at one resolution, in run order.
    1080p gets the whole sweep; 720p the best few configurations of each decoder."""
    kind = "dali-gpu" if device == "gpu" else "dali-cpu"
    full = res != "720p"
    readers = [int(x) for x in args.readers.split(",") if x] if full else [7, 14]
    pipelines = [int(x) for x in args.pipelines.split(",") if x] if full else [7]
    if args.smoke:  # 4 tiny files make 12 clips: fewer shards than that
        readers, pipelines = [1, 2], [2]
    seconds = 1.0 if args.smoke else args.seconds
    rows = []
    for k in readers:
        rows.append((f"DALI reader x{k} (one pipeline)", kind, bench_reader,
                     dict(files=files, device=device, instances=k, seconds=seconds)))
    if full and not args.smoke:
        rows.append(("DALI reader x7, 48-frame clips", kind, bench_reader,
                     dict(files=files, device=device, instances=7, seconds=seconds, seq=48)))
    # training reads clips in random order: each clip then starts with a seek (decode from the key
    # frame before it), which the in-order rows above never pay
    for k in ([1, 7] if full and not args.smoke else [2] if args.smoke else []):
        rows.append((f"DALI reader x{k}, shuffled clips", kind, bench_reader,
                     dict(files=files, device=device, instances=k, seconds=seconds, shuffle=True)))
    for k in pipelines:
        rows.append((f"DALI pipelines x{k} (threads, one process)", kind, bench_pipelines,
                     dict(files=files, device=device, count=k, seconds=seconds)))
    # crossdali's loader itself (crop, flip, normalize included): one pipeline, and the shard split
    # over several (``pipelines=``, the loader-level shape of the "pipelines" rows above)
    small = {"batch": 4, "crop": 32} if args.smoke else {}
    loader_pipelines = [int(v) for v in args.loader_pipelines.split(",") if v]
    for k in ([1, 2] if args.smoke else loader_pipelines if full else [7]):
        rows.append((f"crossdali loader (PyTorch), {k} pipeline{'s' if k > 1 else ''}", kind, bench_loader,
                     dict(files=files, device=device, pipelines=k, seconds=seconds, **small)))
    # consecutive clips decoded as one read (``clips_per_read``): 3 x 16 frames = the gop48 files' key-frame
    # interval, so every read starts on a key frame; 4 reads per pipeline and step: as many as the rows above
    read_rows = [tuple(int(v) for v in r.split("x")) for r in args.read_rows.split(",") if r]
    read_pipelines = [1] if args.smoke else [int(v) for v in args.read_pipelines.split(",") if v]
    for n, (k, reads) in itertools.product(read_pipelines, [(2, 2)] if args.smoke else read_rows if full else read_rows[:1]):
        rows.append((f"crossdali loader (PyTorch), {n} pipeline{'s' if n > 1 else ''}, {k} clips per read, "
                     f"batch {n * reads * k}", kind, bench_loader,
                     dict(files=files, device=device, pipelines=n, seconds=seconds, clips_per_read=k,
                          **(small | {"batch": n * reads * k}))))
    # the loader's training defaults: nothing passed that affects speed but the batch
    for b in ([4] if args.smoke else [int(v) for v in args.default_batches.split(",") if v] if full else []):
        rows.append((f"crossdali loader (PyTorch), training defaults, batch {b}", kind, in_own_process,
                     dict(row_fn=bench_loader, files=files, device=device, pipelines=None, clips_per_read=None,
                          seconds=seconds, memory=True, **(small | {"batch": b}))))
    # the val split: clips in file order (and, for H.264 on the GPU, the experimental reader)
    for k in ([1] if args.smoke else [1, 7] if full else []):
        rows.append((f"crossdali loader (PyTorch), {k} pipeline{'s' if k > 1 else ''}, val split (clips in order)",
                     kind, bench_loader, dict(files=files, device=device, pipelines=k, seconds=seconds, train=False,
                                              **small)))
    if device == "gpu":
        for k in ([1, 4, 7, 14] if full else [7]):
            rows.append((f"DALI legacy readers.video x{k} (one pipeline)", kind, bench_reader,
                         dict(files=files, device=device, instances=k, seconds=seconds, legacy=True)))
        if full:
            for k in (7, 14):
                rows.append((f"DALI legacy readers.video x{k}, 48-frame clips", kind, bench_reader,
                             dict(files=files, device=device, instances=k, seconds=seconds, seq=48, legacy=True)))
            # the shape a loader with one pipeline per sub-shard would have:
            # k pipelines of one legacy reader each, beside k readers in one pipeline above
            rows.append(("DALI legacy readers.video, 7 pipelines (threads)", kind, bench_pipelines,
                         dict(files=files, device=device, count=7, seconds=seconds, legacy=True)))
            rows.append(("DALI legacy readers.video x7, shuffled clips", kind, bench_reader,
                         dict(files=files, device=device, instances=7, seconds=seconds, legacy=True, shuffle=True)))
    if full:
        rows.append((f"DALI decoders.video batch 7 ({args.decoder_frames} fr/file)", kind, bench_decoder,
                     dict(files=files, device=device, batch=7, frames_per_file=min(args.decoder_frames, n_frames),
                          seconds=seconds)))
    if device == "gpu" and full:
        rows.append(("optical flow (reader + fn.optical_flow)", "optical-flow", bench_optical_flow,
                     dict(files=files, seconds=seconds)))
    if device == "gpu" and args.peers:
        if _peer_available("PyNvVideoCodec"):
            for t in ([1, 7, 14] if full else [14]):
                rows.append((f"PyNvVideoCodec SimpleDecoder x{t} threads", "peer-gpu", bench_peer,
                             dict(files=files, peer="pynvvideocodec", threads=t, seconds=seconds)))
        if _peer_available("torchcodec"):
            for backend, t in ([("beta", 1), ("beta", 7), ("beta", 14), ("ffmpeg", 7)] if full else [("beta", 14)]):
                rows.append((f"torchcodec CUDA ({backend}) x{t} threads", "peer-gpu", bench_peer,
                             dict(files=files, peer="torchcodec", threads=t, seconds=seconds, backend=backend,
                                  ld_path=args.peer_ld_path)))
    for lib in ("pyav", "opencv"):
        if env.get("av" if lib == "pyav" else "cv2") is None:
            continue
        if full:
            rows.append((f"{lib} CPU, 1 stream", "cpu", bench_cpu, dict(files=files, lib=lib, procs=1, seconds=seconds)))
        rows.append((f"{lib} CPU, {args.cpu_procs} processes", "cpu", bench_cpu,
                     dict(files=files, lib=lib, procs=args.cpu_procs, seconds=seconds)))
    return [r for r in rows if not args.only or any(o in r[0] for o in args.only)]


def main(args: argparse.Namespace) -> dict:
    from benchmarks.engine_load import EngineLoad

    t0 = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    unknown = [r for r in args.resolutions.split(",") if r and r not in RESOLUTIONS]
    if unknown:
        raise usage_error(f"--resolutions: unknown {', '.join(unknown)}; choose from {', '.join(RESOLUTIONS)}")
    if importlib.util.find_spec("av") is None:
        raise usage_error("this benchmark needs PyAV (pip install av): it encodes the H.264 test videos, and "
                          "crossdali's video loader counts clips with it")
    work = args.work or Path(tempfile.mkdtemp(prefix="crossdali_video_bench_"))
    env = _environment()
    print(json.dumps(env), flush=True)
    device = "cpu" if args.smoke else "gpu"
    resolutions = ({"smoke": (160, 96)} if args.smoke
                   else {r: RESOLUTIONS[r] for r in args.resolutions.split(",") if r})
    results: list[dict] = []
    videos_meta = {}
    with EngineLoad(log=args.out / "video_decode_dmon.log") as load:

        def run(name: str, resolution: str, kind: str, fn, **kw) -> None:
            elapsed_total = time.perf_counter() - t0
            row = {"name": name, "resolution": resolution, "kind": kind}
            if elapsed_total > args.budget_s:
                row["skipped"] = f"time budget of {args.budget_s:.0f} s used up"
            else:
                try:
                    row |= fn(**kw)
                    row["fps"] = row["frames"] / row["seconds"]
                    if "t0" in row:
                        row["engine_load"] = load.mean(row.pop("t0"), row.pop("t1"))
                    if row.get("cpu_s") is not None:
                        row["cpu_cores_busy"] = round(row["cpu_s"] / row["seconds"], 2)
                except Exception as e:  # record and go on: the run is unattended
                    row["error"] = f"{type(e).__name__}: {e}"[:2000]
                    traceback.print_exc()
            results.append(row)
            shown = f"{row['fps']:,.0f} frames/s" if "fps" in row else row.get("error") or row.get("skipped")
            eng = row.get("engine_load") or {}
            extra = (f"  dec {eng['dec']:.0f} % (max {eng['dec_max']:.0f})  sm {eng.get('sm', 0):.0f} %"
                     if "dec" in eng else "")
            cores = f"  cpu {row['cpu_cores_busy']:.1f} cores" if "cpu_cores_busy" in row else ""
            print(f"[{time.perf_counter() - t0:6.1f} s] {resolution:6s} {name:46s} {shown}{extra}{cores}", flush=True)

        for res, (w, h) in resolutions.items():
            start = time.perf_counter()
            codec = "vp9" if args.smoke else "h264"
            n_files = 4 if args.smoke else args.files
            n_frames = 48 if args.smoke else args.frames
            try:
                files, written, encoder = make_videos(work / f"{res}-{args.encode}", w, h, files=n_files,
                                                      frames=n_frames, codec=codec, encode=args.encode)
            except Exception as e:
                results.append({"name": "make test videos", "resolution": res, "error": f"{type(e).__name__}: {e}"})
                traceback.print_exc()
                continue
            size = sum(Path(f).stat().st_size for f in files)
            videos_meta[res] = {"files": len(files), "frames_per_file": n_frames, "width": w, "height": h,
                                "codec": written, "encoder": encoder,
                                "encode": ENCODES[args.encode] if encoder == "pyav" and codec == "h264" else None,
                                "seconds_to_make": time.perf_counter() - start, "bytes": size,
                                "mbit_per_s_at_25_fps": round(size * 8 / (len(files) * n_frames / 25) / 1e6, 2)}
            print(f"[{time.perf_counter() - t0:6.1f} s] {res}: {len(files)} x {n_frames} frames {written} "
                  f"({encoder}, {videos_meta[res]['mbit_per_s_at_25_fps']} Mbit/s) in "
                  f"{time.perf_counter() - start:.1f} s", flush=True)
            for name, kind, fn, kw in row_plan(args, res, files, n_frames, env, device):
                run(name, res, kind, fn, **kw)

    best_1080 = max((r["fps"] for r in results if r.get("resolution") == "1080p" and r.get("kind") == "dali-gpu"
                     and "fps" in r), default=None)
    best_cpu_1080 = max((r["fps"] for r in results if r.get("resolution") == "1080p" and r.get("kind") == "cpu"
                         and "fps" in r), default=None)
    best_peer_1080 = max((r["fps"] for r in results if r.get("resolution") == "1080p" and r.get("kind") == "peer-gpu"
                          and "fps" in r), default=None)
    report = {"benchmark": "video_decode", "command": "python -m benchmarks.video_decode " + " ".join(sys.argv[1:]),
              "environment": env, "encode": args.encode, "videos": videos_meta,
              "seconds_per_config": 1.0 if args.smoke else args.seconds,
              "target_1080p_frames_per_s": TARGET_1080P, "best_dali_gpu_1080p": best_1080,
              "best_peer_gpu_1080p": best_peer_1080, "best_cpu_1080p": best_cpu_1080,
              "target_met": None if best_1080 is None else best_1080 >= TARGET_1080P,
              "engine_load": "mean nvidia-smi dmon -s u percentages over each row's timed window (1 s samples)",
              "total_seconds": time.perf_counter() - t0, "results": results}
    (args.out / "video_decode.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(results, args.out / "video_decode.png")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {args.out / 'video_decode.json'} and video_decode.png in {time.perf_counter() - t0:.0f} s; "
          f"best DALI GPU 1080p: {best_1080}, best peer: {best_peer_1080}", flush=True)
    return report


if __name__ == "__main__":
    main(get_args_parser().parse_args())
