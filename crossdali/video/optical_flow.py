"""Optical flow on video clips with DALI (the GPU's optical-flow engine): a colour-coded flow PNG
and a short summary.

    python -m crossdali.video.optical_flow                       # embedded sample clips
    python -m crossdali.video.optical_flow --data clips/ --output-dir runs/flow

Needs an NVIDIA GPU of the Turing generation or newer (it has the optical-flow engine); on any
other machine it stops at once with an error that says so. On the sample clips the summary
checks the flow against the known motion: ``up`` clips must flow upwards (dy < 0), ``down``
downwards, ``grow`` outwards and ``shrink`` inwards.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np

from crossdali.common.classification import PipelineOptions
from crossdali.common.data.sample_data.video import VIDEO_SIZES, ensure_video
from crossdali.common.data.videos import resolve_video_source
from crossdali.common.optical_flow import create_optical_flow_pipeline, flow_to_frame_pixels, require_optical_flow_hardware

log = logging.getLogger("crossdali.video.optical_flow")


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="crossdali optical flow example", add_help=add_help)
    parser.add_argument("--data", type=Path, default=None,
                        help="folder with val.txt or val/<class>/<video>, or a file list; default: sample clips")
    parser.add_argument("--split", default="val")
    parser.add_argument("--sample-size", default="small", choices=sorted(VIDEO_SIZES))
    parser.add_argument("--device-id", type=int, default=0)
    parser.add_argument("--clip-len", type=int, default=8, help="frames per sequence (flow between neighbours)")
    parser.add_argument("--frame-stride", type=int, default=1)
    parser.add_argument("--flow-size", type=int, default=256, help="frames are resized to this square first")
    parser.add_argument("--output-grid", type=int, default=4, choices=[1, 2, 4])
    parser.add_argument("--preset", type=float, default=0.5, help="0 best quality ... 1 fastest")
    parser.add_argument("-b", "--batch-size", type=int, default=4)
    parser.add_argument("-j", "--workers", type=int, default=4)
    parser.add_argument("--output-dir", type=Path, default=Path("runs/optical_flow"))
    return parser


def flow_to_rgb(flow: np.ndarray, max_magnitude: float | None = None) -> np.ndarray:
    """Colour-code a ``(H, W, 2)`` flow field: hue = direction, brightness = speed."""
    from matplotlib.colors import hsv_to_rgb

    dx, dy = flow[..., 0], flow[..., 1]
    mag = np.hypot(dx, dy)
    top = max_magnitude or float(np.percentile(mag, 99)) or 1.0
    hsv = np.stack([(np.arctan2(-dy, dx) / (2 * np.pi)) % 1.0, np.ones_like(mag), np.clip(mag / top, 0, 1)], -1)
    return (hsv_to_rgb(hsv) * 255).astype(np.uint8)


def _radial(flow: np.ndarray) -> float:
    """Mean outward component of the flow about the field's centre (> 0: expanding)."""
    h, w = flow.shape[-3:-1]
    ys, xs = np.mgrid[0:h, 0:w]
    ry, rx = ys - (h - 1) / 2, xs - (w - 1) / 2
    norm = np.hypot(rx, ry) + 1e-6
    return float(((flow[..., 0] * rx + flow[..., 1] * ry) / norm).mean())


def save_figure(path: Path, frames: np.ndarray, flow: np.ndarray, title: str) -> None:
    """First frame, last frame and the colour-coded mean flow of one clip, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mean_flow = flow.mean(axis=0)
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.6))
    axes[0].imshow(frames[0])
    axes[0].set_title("first frame")
    axes[1].imshow(frames[-1])
    axes[1].set_title("last frame")
    h, w = frames.shape[1:3]
    axes[2].imshow(flow_to_rgb(mean_flow), extent=(0, w, h, 0))
    gy, gx = mean_flow.shape[:2]
    step = max(1, gy // 12)
    ys, xs = np.mgrid[0:gy:step, 0:gx:step]
    axes[2].quiver((xs + 0.5) * w / gx, (ys + 0.5) * h / gy, mean_flow[ys, xs, 0], mean_flow[ys, xs, 1],  # image axes: y down
                   color="white", scale_units="xy", angles="xy", scale=0.25)
    axes[2].set_title("flow (hue: direction, brightness: speed)")
    for ax in axes:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(args: argparse.Namespace) -> dict:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    require_optical_flow_hardware("gpu", args.device_id)  # fail before building anything
    data = args.data if args.data is not None else ensure_video(size=args.sample_size)
    src = resolve_video_source(data, args.split)
    classes = list(src.classes) or [str(i) for i in range(src.num_classes)]
    opts = PipelineOptions(batch_size=args.batch_size, device="gpu", device_id=args.device_id,
                           num_threads=args.workers)
    pipe = create_optical_flow_pipeline(src.files, labels=src.labels, options=opts, sequence_length=args.clip_len,
                                        stride=args.frame_stride, flow_size=args.flow_size,
                                        output_grid=args.output_grid, preset=args.preset)
    pipe.build()
    num_clips = pipe.epoch_size(next(iter(pipe.epoch_size())))
    batches = -(-num_clips // args.batch_size)
    per_class: dict[str, list[tuple[float, float, float]]] = {c: [] for c in classes}
    example = None
    flows = 0
    start = time.perf_counter()
    for _ in range(batches):
        frames_b, flow_b, labels_b = (o.as_cpu() if hasattr(o, "as_cpu") else o for o in pipe.run())
        for i in range(len(labels_b)):
            frames, label = np.asarray(frames_b[i]), int(np.asarray(labels_b[i])[0])
            flow = flow_to_frame_pixels(np.asarray(flow_b[i]), frames.shape[1:3], args.flow_size) / args.frame_stride
            flows += flow.shape[0]
            per_class[classes[label]].append((float(flow[..., 0].mean()), float(flow[..., 1].mean()), _radial(flow)))
            if example is None or (classes[label] == "up" and example[2] != "up"):
                example = (frames, flow, classes[label])
    elapsed = time.perf_counter() - start
    args.output_dir.mkdir(parents=True, exist_ok=True)
    png = args.output_dir / "optical_flow.png"
    save_figure(png, example[0], example[1], f"class '{example[2]}': mean flow of one clip")
    summary = {
        "clips": num_clips, "flow_fields": flows, "seconds": elapsed, "flow_fields_per_s": flows / elapsed,
        "flow_size": args.flow_size, "output_grid": args.output_grid, "png": str(png),
        "per_class": {c: {"clips": len(v), "mean_dx": float(np.mean([x[0] for x in v])),
                          "mean_dy": float(np.mean([x[1] for x in v])),
                          "mean_radial": float(np.mean([x[2] for x in v]))}
                      for c, v in per_class.items() if v},
    }
    (args.output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    log.info("%d clips, %d flow fields in %.1f s (%.0f fields/s, pipeline incl. decode)", num_clips, flows,
             elapsed, flows / elapsed)
    for c, s in summary["per_class"].items():
        log.info("  %-8s %4d clips  mean flow dx %+.2f dy %+.2f px/frame  radial %+.2f", c, s["clips"],
                 s["mean_dx"], s["mean_dy"], s["mean_radial"])
    log.info("wrote %s and %s", png, args.output_dir / "summary.json")
    return summary


if __name__ == "__main__":
    main(get_args_parser().parse_args())
