"""Other GPU video decoders, timed the way ``benchmarks.video_decode`` times DALI (its peer rows).

    python -m benchmarks.video_peers --peer pynvvideocodec --threads 7 --seconds 6 FILE...
    python -m benchmarks.video_peers --peer torchcodec --backend beta --threads 7 --seconds 6 FILE...

Each peer decodes whole files to RGB frames on the GPU from ``--threads`` Python threads (file i goes
to thread i mod T, round after round until the time is up), one decoder per thread that moves on to
its next file the way the library's documentation recommends (PyNvVideoCodec: ``SimpleDecoder`` +
``reconfigure_decoder``; torchcodec: a ``VideoDecoder`` per file, frames in chunks of 16). After
every thread has delivered its first chunk, frames are counted for ``--seconds``. Prints one JSON
line: frames, seconds, the timed window's ``time.perf_counter()`` stamps (CLOCK_MONOTONIC, so the
parent's engine-load sampler can use them) and the CPU seconds this process used in the window.

Its own process on purpose: each library loads its own FFmpeg build, and a crash in one must not end
the benchmark run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

CHUNK = 16  # frames per call: the clip length of the DALI rows


def _pynvvideocodec_worker(files: list[str]):
    import PyNvVideoCodec as nvc

    decoder = None
    while True:
        for path in files:
            if decoder is None:
                decoder = nvc.SimpleDecoder(path, gpu_id=0, use_device_memory=True,
                                            output_color_type=nvc.OutputColorType.RGB)
            else:
                decoder.reconfigure_decoder(path)
            while True:
                frames = decoder.get_batch_frames(CHUNK)
                if not frames:
                    break
                yield len(frames)


def _torchcodec_worker(files: list[str], backend: str):
    import torch
    import torchcodec
    from torchcodec.decoders import VideoDecoder

    if torchcodec.__version__.endswith("+cpu"):
        raise RuntimeError(f"torchcodec {torchcodec.__version__} is the CPU-only build (PyPI's); the CUDA build "
                           "comes from https://download.pytorch.org/whl/cu130 (pip install torchcodec --index-url ...)")

    try:
        from torchcodec.decoders import set_cuda_backend
    except ImportError:  # older torchcodec: FFmpeg's NVDEC path only
        set_cuda_backend = None
    while True:
        for path in files:
            if set_cuda_backend is not None:
                with set_cuda_backend(backend):
                    decoder = VideoDecoder(path, device="cuda:0", seek_mode="approximate")
            else:
                decoder = VideoDecoder(path, device="cuda:0", seek_mode="approximate")
            n = decoder.metadata.num_frames
            for start in range(0, n, CHUNK):
                batch = decoder.get_frames_in_range(start, min(n, start + CHUNK))
                torch.cuda.current_stream().synchronize()
                yield batch.data.shape[0]


def run(peer: str, files: list[str], *, threads: int, seconds: float, backend: str = "beta") -> dict:
    shards = [files[i::threads] or files[i % len(files):][:1] for i in range(threads)]
    ready = threading.Barrier(threads + 1)
    stop = threading.Event()
    counts = [0] * threads
    errors: list[str] = []

    def loop(i: int) -> None:
        try:
            gen = (_pynvvideocodec_worker(shards[i]) if peer == "pynvvideocodec"
                   else _torchcodec_worker(shards[i], backend))
            next(gen)  # decoder made, first chunk out: warm
        except Exception as e:  # reported in the JSON; the barrier still has to be reached
            errors.append(f"{type(e).__name__}: {e}")
            ready.wait()
            return
        ready.wait()
        for n in gen:
            if stop.is_set():
                break
            counts[i] += n

    workers = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    ready.wait()
    cpu0, t0 = os.times(), time.perf_counter()
    time.sleep(seconds)
    stop.set()
    t1 = time.perf_counter()
    frames = sum(counts)
    cpu1 = os.times()
    for w in workers:
        w.join(timeout=30)
    if errors and not frames:
        raise RuntimeError(errors[0])
    return {"frames": frames, "seconds": t1 - t0, "t0": t0, "t1": t1, "threads": threads,
            "cpu_s": (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system), "thread_errors": errors[:3]}


def versions(peer: str) -> dict:
    mod = "PyNvVideoCodec" if peer == "pynvvideocodec" else "torchcodec"
    return {mod: getattr(__import__(mod), "__version__", "?")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peer", choices=("pynvvideocodec", "torchcodec"), required=True)
    parser.add_argument("--backend", default="beta", help="torchcodec CUDA backend: beta (NVCUVID) or ffmpeg (NVDEC)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    try:
        out = versions(args.peer) | run(args.peer, args.files, threads=args.threads, seconds=args.seconds,
                                        backend=args.backend)
    except Exception as e:  # one JSON line either way: the parent records it beside the other rows
        print(json.dumps({"error": f"{type(e).__name__}: {e}"[:2000]}), flush=True)
        return 1
    print(json.dumps(out), flush=True)
    os._exit(0)  # skip interpreter teardown: decoder threads may still be inside the driver


if __name__ == "__main__":
    sys.exit(main())
