"""Video sample set: short constant-frame-rate clips whose label needs motion to tell apart.

A patch cut from a real photo moves over a real background texture. The class is the motion,
never the content (every class uses every photo), and every class is unchanged by a horizontal
flip, so the clip pipeline's random flip keeps labels valid:

    up      the patch rises          down    the patch sinks
    grow    the patch expands        shrink  the patch contracts

One frame cannot tell ``up`` from ``down`` or ``grow`` from ``shrink``: a model has to look
across time. Layout (``root/<size>/video``)::

    train/<class>/<nnnn>.webm   VP9 (DALI decodes it on the CPU and the GPU)
    val/<class>/<nnnn>.webm
    train.txt, val.txt          '<relative path> <label>' per line (DALI's file_list format)
    h264/{train,val}/...        the same clips as H.264 MP4 (GPU readers and benchmarks)
    h264/train.txt, h264/val.txt
    index/count_<n>.webm        frames whose grey level encodes the frame index (frame-order tests)
    index.txt
    manifest.json

Encoded with PyAV (``pip install av``), which bundles libvpx and libx264.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
from PIL import Image

from crossdali.common.data.sample_data.photos import BACKGROUND_PHOTOS, CLASS_PHOTOS, load_photo

__all__ = [
    "INDEX_LEVEL_STEP",
    "VIDEO_CLASSES",
    "VIDEO_SIZES",
    "VideoSampleConfig",
    "build_video",
    "ensure_video",
    "write_index_video",
    "write_video",
]

log = logging.getLogger(__name__)

VIDEO_CLASSES: tuple[str, ...] = ("up", "down", "grow", "shrink")
SPLITS = ("train", "val")
#: Frame ``i`` of an index video is uniformly grey at ``i * INDEX_LEVEL_STEP``: robust to lossy
#: VP9 / H.264 coding (errors stay below 2 grey levels on flat frames).
INDEX_LEVEL_STEP = 5

_CODECS = {"vp9": ("libvpx-vp9", ".webm"), "h264": ("libx264", ".mp4")}


@dataclass(frozen=True)
class VideoSampleConfig:
    """How many clips, how long, how large. ``VIDEO_SIZES`` holds the named presets."""

    train_per_class: int = 48
    val_per_class: int = 11
    num_frames: int = 48
    side: int = 128  # NVDEC decodes VP9 from 128x128 up
    fps: int = 25
    h264: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("train_per_class", "val_per_class", "num_frames", "side", "fps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.side % 2:
            raise ValueError(f"side must be even (4:2:0 chroma), got {self.side}")


#: ``tiny`` keeps CI fast on 2 cores (64 px: the CPU decodes it; NVDEC needs 128 px for VP9, hence
#: ``gpu-tiny`` for the GPU tests); ``bench`` gives the GPU reader longer, larger files.
VIDEO_SIZES: dict[str, VideoSampleConfig] = {
    "tiny": VideoSampleConfig(train_per_class=20, val_per_class=5, num_frames=32, side=64),
    "gpu-tiny": VideoSampleConfig(train_per_class=5, val_per_class=5, num_frames=32, side=128),  # GPU tests
    "small": VideoSampleConfig(),
    "bench": VideoSampleConfig(train_per_class=100, val_per_class=25, num_frames=96, side=224),
}


def write_video(path: str | Path, frames: np.ndarray | Sequence[np.ndarray], *, fps: int = 25, codec: str = "vp9",
                pts: Sequence[int] | None = None, time_base: Fraction | None = None,
                options: dict[str, str] | None = None) -> Path:
    """Encode RGB uint8 frames ``(F, H, W, 3)`` to ``path`` with PyAV.

    Constant frame rate by default (frame ``i`` at ``i / fps`` s). ``pts`` (in ``time_base``
    units) gives each frame its own time, which is how the tests make a variable-frame-rate file.
    ``options``: more encoder options (e.g. x264's ``{"g": "16"}``: a key frame every 16 frames).
    """
    import av  # defer: only the builders and tests encode

    if codec not in _CODECS:
        raise ValueError(f"codec must be one of {sorted(_CODECS)}, got {codec!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frames = list(frames)
    h, w = frames[0].shape[:2]
    tb = time_base if time_base is not None else Fraction(1, fps)
    with av.open(str(path), "w") as out:
        stream = out.add_stream(_CODECS[codec][0], rate=fps)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        stream.time_base = tb
        if codec == "vp9":
            stream.options = {"crf": "12", "b:v": "0", "deadline": "realtime", "cpu-used": "8"}
        else:
            stream.options = {"crf": "18", "preset": "veryfast"}
        stream.options = dict(stream.options) | dict(options or {})
        for i, frame in enumerate(frames):
            vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame, dtype=np.uint8), format="rgb24")
            vf.pts = pts[i] if pts is not None else round(Fraction(i, fps) / tb)
            vf.time_base = tb
            for packet in stream.encode(vf):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


def index_frames(num_frames: int, side: int = 64) -> np.ndarray:
    """Flat grey frames; frame ``i`` has level ``i * INDEX_LEVEL_STEP`` (at most 52 frames)."""
    if num_frames * INDEX_LEVEL_STEP > 256:
        raise ValueError(f"an index video holds at most {256 // INDEX_LEVEL_STEP} frames, got {num_frames}")
    levels = np.arange(num_frames, dtype=np.uint8) * INDEX_LEVEL_STEP
    return np.broadcast_to(levels[:, None, None, None], (num_frames, side, side, 3)).copy()


def write_index_video(path: str | Path, num_frames: int, *, side: int = 64, fps: int = 25,
                      codec: str = "vp9") -> Path:
    """A video whose frames encode their index (see ``index_frames``)."""
    return write_video(path, index_frames(num_frames, side), fps=fps, codec=codec)


def _resize(img: np.ndarray, w: int, h: int) -> np.ndarray:
    return np.asarray(Image.fromarray(img).resize((max(1, w), max(1, h)), Image.BILINEAR))


def _clip_frames(label: int, rng: np.random.Generator, cfg: VideoSampleConfig) -> np.ndarray:
    """One clip of class ``label``: a photo patch moving over a background texture."""
    s, n = cfg.side, cfg.num_frames
    bg_photo = load_photo(BACKGROUND_PHOTOS[int(rng.integers(len(BACKGROUND_PHOTOS)))])
    bh, bw = bg_photo.shape[:2]
    c = int(rng.integers(min(bh, bw) // 3, min(bh, bw) + 1))
    by, bx = int(rng.integers(0, bh - c + 1)), int(rng.integers(0, bw - c + 1))
    background = _resize(bg_photo[by : by + c, bx : bx + c], s, s)

    photo = load_photo(CLASS_PHOTOS[int(rng.integers(len(CLASS_PHOTOS)))])
    ph, pw = photo.shape[:2]
    c = int(rng.integers(min(ph, pw) // 3, min(ph, pw) + 1))
    py, px = int(rng.integers(0, ph - c + 1)), int(rng.integers(0, pw - c + 1))
    patch_src = photo[py : py + c, px : px + c]

    t = np.linspace(0.0, 1.0, n)
    name = VIDEO_CLASSES[label]
    if name in ("up", "down"):
        size = np.full(n, rng.uniform(0.3, 0.45) * s)
        half = size[0] / 2
        travel = rng.uniform(0.6, 0.9) * (s - size[0])
        start = rng.uniform(half + travel, s - half)  # the lowest point of the path
        cy = start - travel * t if name == "up" else (start - travel) + travel * t
        cx = np.full(n, rng.uniform(0.3, 0.7) * s)
    else:
        small, large = rng.uniform(0.15, 0.25) * s, rng.uniform(0.55, 0.75) * s
        size = small + (large - small) * t if name == "grow" else large - (large - small) * t
        cy = np.full(n, rng.uniform(0.4, 0.6) * s)
        cx = np.full(n, rng.uniform(0.4, 0.6) * s)

    frames = np.empty((n, s, s, 3), np.uint8)
    for i in range(n):
        frame = background.copy()
        k = max(2, round(size[i]))
        patch = _resize(patch_src, k, k)
        y, x = round(cy[i] - k / 2), round(cx[i] - k / 2)
        y0, x0, y1, x1 = max(0, y), max(0, x), min(s, y + k), min(s, x + k)
        if y1 > y0 and x1 > x0:
            frame[y0:y1, x0:x1] = patch[y0 - y : y1 - y, x0 - x : x1 - x]
        frames[i] = frame
    return frames


def build_video(root: Path, cfg: VideoSampleConfig, *, force: bool = False) -> Path:
    """Build the video sample set under ``root/video``; return that folder.

    Reused when a set with the same config exists (unless ``force``); written to a temporary
    folder and renamed into place, so an interrupted build is never reused.
    """
    out = Path(root) / "video"
    manifest_path = out / "manifest.json"
    if not force and manifest_path.is_file():
        try:
            if json.loads(manifest_path.read_text())["config"] == asdict(cfg):
                return out  # reused without PyAV: environments that only read the clips need not install it
        except (ValueError, KeyError):
            pass  # unreadable manifest: rebuild
    try:
        import av  # noqa: F401
    except ImportError:
        raise ImportError("the video sample set is encoded with PyAV, which is not installed: pip install av "
                          "(or build only the other kinds: --kind classification)") from None
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    codecs = ("vp9", "h264") if cfg.h264 else ("vp9",)
    counts = {}
    for split_id, split in enumerate(SPLITS):
        per_class = cfg.train_per_class if split == "train" else cfg.val_per_class
        lines: dict[str, list[str]] = {c: [] for c in codecs}
        for label, name in enumerate(VIDEO_CLASSES):
            for i in range(per_class):
                frames = _clip_frames(label, np.random.default_rng([cfg.seed, split_id, label, i]), cfg)
                for codec in codecs:
                    rel = f"{split}/{name}/{i:04d}{_CODECS[codec][1]}"
                    folder = tmp if codec == "vp9" else tmp / codec
                    write_video(folder / rel, frames, fps=cfg.fps, codec=codec)
                    lines[codec].append(f"{rel} {label}\n")
        for codec in codecs:
            folder = tmp if codec == "vp9" else tmp / codec
            (folder / f"{split}.txt").write_text("".join(lines[codec]))
        counts[split] = per_class * len(VIDEO_CLASSES)
        log.info("video %s: %d clips of %d frames, %dx%d", split, counts[split], cfg.num_frames, cfg.side, cfg.side)
    index_lines = []
    for n in (40, 51):
        write_index_video(tmp / "index" / f"count_{n}.webm", n, side=64, fps=cfg.fps)
        index_lines.append(f"index/count_{n}.webm {n}\n")
    (tmp / "index.txt").write_text("".join(index_lines))
    manifest = {"config": asdict(cfg), "classes": list(VIDEO_CLASSES), "counts": counts,
                "index_step": INDEX_LEVEL_STEP}
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def ensure_video(root: Path | None = None, size: str = "small") -> Path:
    """Build the video sample set of the named ``size`` if missing; return its folder."""
    from crossdali.common.data.sample_data import default_root  # defer: the package imports this module

    if size not in VIDEO_SIZES:
        raise ValueError(f"unknown sample size {size!r}; choose one of {sorted(VIDEO_SIZES)}")
    root = Path(root) if root is not None else default_root()
    return build_video(root / size, VIDEO_SIZES[size])
