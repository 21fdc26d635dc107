"""Re-encode a video to constant-frame-rate VP9 WebM, which DALI reads on the CPU and the GPU.

    python -m crossdali.video.reencode IN.mp4 OUT.webm --fps 25

The fix the clip pipeline's errors point to for H.264 files on a CPU-only machine and for
variable-frame-rate files. Output frame ``k`` shows the input frame on screen at ``k / fps``
seconds (as ffmpeg's ``fps`` filter does): frames are repeated or dropped, never blended.
Uses PyAV (``pip install av``), so no ffmpeg binary is needed.
"""

from __future__ import annotations

import argparse
from fractions import Fraction
from pathlib import Path


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=add_help)
    parser.add_argument("src", type=Path, help="input video (any codec FFmpeg decodes)")
    parser.add_argument("dst", type=Path, help="output .webm")
    parser.add_argument("--fps", type=int, default=25, help="constant output frame rate")
    parser.add_argument("--crf", type=int, default=32, help="VP9 quality (lower is better, 15-35 typical)")
    return parser


def reencode(src: Path, dst: Path, *, fps: int = 25, crf: int = 32) -> int:
    """Write ``src`` as constant-frame-rate VP9 to ``dst``; return the number of frames written."""
    import av

    if not Path(src).is_file():
        raise FileNotFoundError(f"{src} does not exist")
    if Path(dst).suffix.lower() != ".webm":
        raise ValueError(f"the output must be a .webm file (VP9), got {dst}")
    written = 0
    with av.open(str(src)) as inp, av.open(str(dst), "w") as out:
        in_stream = inp.streams.video[0]
        stream = out.add_stream("libvpx-vp9", rate=fps)
        stream.width, stream.height = in_stream.codec_context.width, in_stream.codec_context.height
        stream.pix_fmt = "yuv420p"
        stream.time_base = Fraction(1, fps)
        stream.options = {"crf": str(crf), "b:v": "0", "row-mt": "1", "deadline": "realtime", "cpu-used": "8"}

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
    n = reencode(args.src, args.dst, fps=args.fps, crf=args.crf)
    print(f"{args.dst}: {n} frames at a constant {args.fps} fps (VP9)")


if __name__ == "__main__":
    main(get_args_parser().parse_args())
