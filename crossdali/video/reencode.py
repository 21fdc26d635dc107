"""Re-encode a video at a constant frame rate: VP9 WebM (DALI reads it on the CPU and the GPU) or
H.264 MP4 (NVDEC on the GPU), optionally with a key frame every N frames.

    python -m crossdali.video.reencode IN.mp4 OUT.webm --fps 25              # for the CPU, or VFR files
    python -m crossdali.video.reencode IN.mp4 OUT.mp4 --fps 25 --key-every 16   # GPU training set, 16-frame clips

The fix the clip pipeline's errors point to for H.264 files on a CPU-only machine and for
variable-frame-rate files. Output frame ``k`` shows the input frame on screen at ``k / fps``
seconds (as ffmpeg's ``fps`` filter does): frames are repeated or dropped, never blended.

``--key-every N`` puts a key frame at every N-th frame and nowhere else (no extra ones at scene
cuts, which would shift the rest). Why: DALI's reader decodes each shuffled clip from the key frame
before it; with a key frame at every clip start (N = the clip step) each clip decodes from its own
first frame, which reads shuffled clips much faster for about twice the bitrate
(docs/benchmarks.md#video-decoding). Uses PyAV (``pip install av``), so no ffmpeg binary is needed.
"""

from __future__ import annotations

import argparse
from fractions import Fraction
from pathlib import Path

from crossdali.common.data.videos import ENCODERS, encoder_settings
from crossdali.common.errors import UsageError
from crossdali.common.scripts.script import run


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m crossdali.video.reencode", description=__doc__.splitlines()[0],
                                     add_help=add_help)
    parser.add_argument("src", type=Path, help="input video (any codec FFmpeg decodes)")
    parser.add_argument("dst", type=Path, help="output: .webm (VP9) or .mp4 (H.264)")
    parser.add_argument("--fps", type=int, default=25, help="constant output frame rate")
    parser.add_argument("--crf", type=int, default=None,
                        help="quality, lower is better (default: VP9 32, H.264 23; 15-35 typical)")
    parser.add_argument("--key-every", type=int, default=None, metavar="N",
                        help="a key frame every N frames and nowhere else: the clip step of the training clips "
                             "(default: the encoder's own choice)")
    return parser


def reencode(src: Path, dst: Path, *, fps: int = 25, crf: int | None = None, key_every: int | None = None) -> int:
    """Write ``src`` at a constant ``fps`` to ``dst`` (VP9 for .webm, H.264 for .mp4), with a key
    frame every ``key_every`` frames if given; return the number of frames written."""
    import av

    if not Path(src).is_file():
        raise UsageError(f"{src} does not exist")
    suffix = Path(dst).suffix.lower()
    if suffix not in ENCODERS:
        raise UsageError(f"the output must be a .webm (VP9) or .mp4 (H.264) file, got {dst}")
    if fps < 1 or (key_every is not None and key_every < 1):
        raise UsageError(f"--fps {fps} and --key-every {key_every} must be positive")
    codec, options = encoder_settings(suffix, crf=crf, key_every=key_every)
    written = 0
    with av.open(str(src)) as inp, av.open(str(dst), "w") as out:
        in_stream = inp.streams.video[0]
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height = in_stream.codec_context.width, in_stream.codec_context.height
        stream.pix_fmt = "yuv420p"
        stream.time_base = Fraction(1, fps)
        stream.options = options

        def emit(frame, until: float) -> None:
            nonlocal written
            while written / fps < until - 1e-9:  # every output tick before the next input frame
                vf = av.VideoFrame.from_ndarray(frame, format="rgb24")
                vf.pts, vf.time_base = written, Fraction(1, fps)  # the muxer may change stream.time_base
                for packet in stream.encode(vf):
                    out.mux(packet)
                written += 1

        previous, previous_time, start = None, 0.0, None
        for frame in inp.decode(in_stream):
            t = float(frame.time) if frame.time is not None else previous_time + 1 / fps
            start = t if start is None else start
            if previous is not None:
                emit(previous, t - start)
            previous, previous_time = frame.to_ndarray(format="rgb24"), t
        if previous is not None:
            emit(previous, previous_time - start + 1 / fps)
        for packet in stream.encode():
            out.mux(packet)
    return written


def main(args: argparse.Namespace) -> None:
    n = reencode(args.src, args.dst, fps=args.fps, crf=args.crf, key_every=args.key_every)
    codec = ENCODERS[args.dst.suffix.lower()][0]
    keys = f", a key frame every {args.key_every} frames" if args.key_every else ""
    print(f"{args.dst}: {n} frames at a constant {args.fps} fps ({codec}{keys})")


if __name__ == "__main__":
    run(main, get_args_parser())
