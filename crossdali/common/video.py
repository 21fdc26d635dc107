"""Video clip and optical-flow pipelines, defined once for every framework (DALI functional API).

clip pipeline: DALI's video reader cuts each file into clips of ``sequence_length`` frames,
``stride`` frames apart, a new clip every ``step`` frames. train: clips in random order, one
random-resized crop window and one coin-flip mirror per clip (the same for all of its frames),
normalize. val: clips in file order, resize the shorter side, centre crop, normalize, every clip
exactly once across shards (padded last batch, dropped by the iterator). Output per sample:
``FHWC`` or ``CFHW`` float (batches ``NFHWC`` / ``NCFHW``) and an int64 label of shape ``(1,)``.

Which reader (``clip_reader``): for shuffled clips (train) on the GPU, when every file is H.264 or
HEVC, the legacy ``fn.readers.video`` (NVDEC); otherwise, val (clips in file order) included,
``fn.experimental.readers.video`` (FFmpeg on the CPU, NVDEC on the GPU). Measured with DALI 2.4 on
the H100 (``bash benchmarks/gpu_session.sh videoloader``, 1080p H.264, 2026-11-26,
``results/video/*_2026-11-26.json``): in training's order (clips shuffled) the experimental reader
gave 102-138 frames/s with one instance and 177-202 with seven, NVDEC 3-7 % busy, even with a key
frame at every clip start; the legacy reader with seven instances gave 1,831-1,840 (a key frame
every 48 frames) and 3,411 (every 16), NVDEC 80-87 % busy. crossdali's PyTorch loader in training's
order went from 107-127 (1 pipeline) and 151-181 (7 pipelines) with the experimental reader to 306
and 1,759-1,760 with the legacy one (4: 1,060-1,082). In file order (val) the experimental reader
decodes on from clip to clip: the val loader gave 323-389 frames/s with it against 277 with the
legacy reader (1 pipeline), and on files with one key frame (x264's defaults, ``--encode
x264-default``) 222 against 83 (the legacy reader decodes each clip from the key frame); with 7
pipelines it gave 1,411 (gop48) and 919 (x264 defaults) where 7 legacy instances read 2,101 and
885-892 raw. So val keeps the experimental reader: at most 1.5x behind in these runs (raw legacy
rows against its loader rows), where the legacy one was up to 2.7x behind. Shuffled, the
x264-default files gave 176-180 (experimental x7) against 782-784 (legacy x7) and 734-743 through
the loader. The legacy reader checkpoints and resumes exactly, shards and pads like the other
(``benchmarks/legacy_reader_probe.py``), and cuts a clip wherever its ``(sequence_length - 1) *
stride + 1`` frames remain (the experimental one needs ``sequence_length * stride``; the clip counts
follow the reader). It has no CPU backend and refuses VP9 WebM, so VP8/VP9/MJPEG/AV1/MPEG-4 files
keep the experimental reader on both devices.
On the CPU the experimental reader decodes only VP8 / VP9 / MJPEG and reports any other codec as a
misleading "number of input samples: 0", so the files are probed with PyAV first and an H.264
file on the CPU path fails with an error that names the codec and the re-encode command (no PyAV
decode fallback: it would be a second, slower decoder to keep equal to DALI's).

One reader leaves NVDEC mostly idle; several per process, each on a slice of the shard, keep it
busy: the loaders' ``pipelines=`` (``crossdali.common.options.sub_shard_options``: one pipeline per
slice, every clip once per epoch, one DALI checkpoint per pipeline). Its default on the GPU
(``default_video_pipelines``) is the largest divisor of the batch size up to 14 in training (twice the
H100's NVDEC count; measured below) and up to 7 for val: 7 kept the engines 86 % busy (1,759 frames/s
above), 4 gave 1,082 and 1 gave 306.

Several clips per read (``clips_per_read``, train): the reader cuts ``clips_per_read`` consecutive
clips as one sequence and ``_split_read`` hands them out as separate clips (the loader unfolds the
batch), so a file's frames are decoded once for all of them instead of once per shuffled clip from
the key frame before it. The clips of a read share their crop window and flip (DALI 2.4's crop,
resize and mirror take no per-frame arguments) and arrive in one batch; reads are shuffled. Measured
on the H100 (``bash benchmarks/gpu_session.sh videoread`` and ``videoread2``, 2026-11-27,
``results/video/reads_*_2026-11-27.json``), 1080p H.264, 16-frame clips shuffled, the PyTorch loader:
on files with a key frame every 48 frames, one clip at a time 1,748-1,755 frames/s (NVDEC 85 % busy),
3 clips per read (48 frames: every read starts on a key frame) 4,131-4,304 with 7 pipelines and
**4,598-4,601 with 14** (NVDEC 93-99 %), beside NVIDIA's PyNvVideoCodec 2.2.4 decoding whole files
in order with 14 threads, 4,443-4,459, in the same runs; on x264-default files (one key frame per
144-frame file) 746 one clip at a time, 4,500-4,526 with 9 clips per read (whole files). Hence the
14-pipeline default in training (``GPU_TRAIN_PIPELINES``), also measured one clip at a time (28 gop48 files,
``videoread3``, ``results/video/pipelines14_run*_2026-11-27.json``): 7 pipelines 1,906-1,908 frames/s (NVDEC
86 %), 14 2,196-2,205 (97-98 %), 96 % of the 2,295 that shuffled 16-frame clips allow on these files; val
(clips in order, the experimental reader) keeps 7, where 14 was not measured.
On a small set the shape of a step matters: 14 files (42 reads) with 4 reads per pipeline and step,
whose last step per pipeline is half padding, gave 2,971-3,047 frames/s, and 28 files (whole steps)
4,158, so the padding reads are decoded too (inferred from these rows, not traced).

optical flow pipeline: ``fn.optical_flow`` (the GPU's optical-flow engine, Turing or newer) on
consecutive frames from the same reader. It has no CPU backend; on a machine without such a GPU
``require_optical_flow_hardware`` raises an error that says what is needed.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from crossdali.common.data.check.exclude import load_exclusions
from crossdali.common.data.sources import DataSource, read_file_list
from crossdali.common.errors import DataError, UsageError
from crossdali.common.options import PipelineOptions

__all__ = [
    "CPU_CODECS",
    "KINETICS_MEAN",
    "KINETICS_STD",
    "LEGACY_READER_CODECS",
    "VIDEO_EXTENSIONS",
    "VIDEO_READER_NAME",
    "ClipCounter",
    "ClipTransform",
    "OpticalFlowUnavailable",
    "VideoInfo",
    "check_videos",
    "clip_reader",
    "clips_per_epoch",
    "count_clips",
    "default_video_pipelines",
    "create_clip_pipeline",
    "create_optical_flow_pipeline",
    "explain_video_failure",
    "flow_to_frame_pixels",
    "probe_video",
    "read_batch_size",
    "require_optical_flow_hardware",
    "resolve_video_source",
    "video_problems",
]

log = logging.getLogger(__name__)

#: Name of the reader operator; iterators pass it as ``reader_name=`` to size epochs.
VIDEO_READER_NAME = "VideoReader"
# Kinetics-400 statistics (torchvision's video models), on the 0-255 scale DALI works in.
KINETICS_MEAN = (0.43216 * 255, 0.394666 * 255, 0.37645 * 255)
KINETICS_STD = (0.22803 * 255, 0.22145 * 255, 0.216989 * 255)
#: Codecs DALI 2.4 decodes on the CPU (FFmpeg names). The GPU adds h264, hevc, av1, mpeg4.
CPU_CODECS = frozenset({"vp8", "vp9", "mjpeg"})
GPU_CODECS = CPU_CODECS | {"h264", "hevc", "av1", "mpeg4"}
#: Codecs the GPU reads with the legacy ``fn.readers.video`` when a whole dataset has them (see above).
LEGACY_READER_CODECS = frozenset({"h264", "hevc"})
#: Most DALI pipelines per process the loaders start on the GPU by default (the H100's 7 NVDEC engines).
GPU_VIDEO_PIPELINES = 7
#: The same for training (clips shuffled): 14 kept the 7 engines 97-99 % busy, one clip or 3 per read (module doc).
GPU_TRAIN_PIPELINES = 14
#: NVDEC's smallest frame per codec where it is larger than the sample clips (measured on the H100,
#: DALI 2.4: a 64x64 VP9 clip fails with "Video is too small ... supported:128x128"; 64x64 H.264 decodes).
GPU_MIN_SIDE = {"vp9": 128}
VIDEO_EXTENSIONS = (".webm", ".mp4", ".mkv", ".avi", ".mov", ".m4v")
# A stream is constant-frame-rate when its frame durations differ by at most this share of the
# median (plus one time-base tick for rounding, e.g. 33/34 ms at 30 fps in WebM's 1/1000 s).
_VFR_TOLERANCE = 0.05
_VFR_PACKETS = 300  # frame durations checked per file: enough to catch VFR, cheap on long files


@dataclass(frozen=True)
class ClipTransform:
    """The clip preset: temporal sampling, spatial sizes, augmentation, output layout and type.

    ``step`` is the distance between the first frames of consecutive clips; ``None`` means
    ``sequence_length * stride`` (what DALI 2.4 does for ``step=-1``, measured, though its docs
    say ``sequence_length``): consecutive clips touch without overlapping. A clip spans
    ``(sequence_length - 1) * stride + 1`` frames.
    ``hflip`` is the mirror probability in training (0 for labels that a flip changes, such as
    left/right motion).
    """

    sequence_length: int = 8
    stride: int = 1
    step: int | None = None
    crop_size: int = 112
    resize_size: int | None = None  # val: shorter side before the centre crop; default crop*128/112
    random_area: tuple[float, float] = (0.25, 1.0)
    random_aspect_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    hflip: float = 0.5
    mean: tuple[float, float, float] = KINETICS_MEAN
    std: tuple[float, float, float] = KINETICS_STD
    output_layout: str = "CFHW"
    dtype: str = "float32"
    clips_per_read: int = 1

    def __post_init__(self) -> None:
        for name in ("sequence_length", "stride", "crop_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.step is not None and self.step < 1:
            raise ValueError(f"step must be positive (or None for sequence_length * stride), got {self.step}")
        if self.output_layout not in ("FHWC", "CFHW"):
            raise ValueError(f"output_layout must be 'FHWC' (batches NFHWC) or 'CFHW' (batches NCFHW), "
                             f"got {self.output_layout!r}")
        if self.dtype not in ("float32", "float16"):
            raise ValueError(f"dtype must be 'float32' or 'float16', got {self.dtype!r}")
        if not 0.0 <= self.hflip <= 1.0:
            raise ValueError(f"hflip must be a probability in [0, 1], got {self.hflip}")
        lo, hi = self.random_area
        if not 0 < lo <= hi <= 1:
            raise ValueError(f"random_area must satisfy 0 < min <= max <= 1, got {self.random_area}")
        if self.clips_per_read < 1:
            raise ValueError(f"clips_per_read must be positive, got {self.clips_per_read}")
        if self.clips_per_read > 1 and self.clip_step != self.sequence_length * self.stride:
            raise ValueError(f"clips_per_read={self.clips_per_read} reads consecutive clips that touch, so step must be "
                             f"sequence_length * stride ({self.sequence_length * self.stride}, the default), "
                             f"got {self.step}")

    @property
    def span(self) -> int:
        """Frames one clip covers, first to last."""
        return (self.sequence_length - 1) * self.stride + 1

    @property
    def frames_needed(self) -> int:
        """Frames a clip needs from its first frame to the file's end: ``sequence_length * stride``.

        DALI 2.4 starts a clip only where that many frames remain (measured), one ``stride - 1``
        more than the clip spans."""
        return self.sequence_length * self.stride

    def frames_needed_by(self, reader: str) -> int:
        """Frames that must remain from a clip's first frame for ``reader`` (``clip_reader``) to cut it
        (measured, DALI 2.4): the legacy reader needs the clip's ``span``, the experimental one
        ``frames_needed``."""
        return self.span if reader == "legacy" else self.frames_needed

    @property
    def clip_step(self) -> int:
        return self.step if self.step is not None else self.sequence_length * self.stride

    @property
    def read(self) -> ClipTransform:
        """What the DALI reader cuts: ``clips_per_read`` consecutive clips as one sequence of
        ``clips_per_read * sequence_length`` frames, a new one every ``clips_per_read`` clip steps
        (the clip itself when ``clips_per_read`` is 1)."""
        k = self.clips_per_read
        if k == 1:
            return self
        return replace(self, sequence_length=k * self.sequence_length, step=k * self.clip_step, clips_per_read=1)

    @property
    def val_resize_size(self) -> int:
        return self.resize_size if self.resize_size is not None else round(self.crop_size * 128 / 112)


def clip_reader(device: str, codecs, *, shuffle: bool = True) -> str:
    """``"legacy"`` (``fn.readers.video``) for shuffled clips on the GPU when every codec is in
    ``LEGACY_READER_CODECS``, else ``"experimental"`` (``fn.experimental.readers.video``): clips in
    file order (val) read faster with the experimental reader (see the module doc)."""
    codecs = set(codecs)
    legacy = shuffle and device == "gpu" and codecs and codecs <= LEGACY_READER_CODECS
    return "legacy" if legacy else "experimental"


def default_video_pipelines(device: str, batch_size: int, *, train: bool = True, clips_per_read: int = 1) -> int:
    """``pipelines=None`` of the video loaders: 1 on the CPU (more only split the same threads); on
    the GPU the largest divisor of DALI's batch (``batch_size / clips_per_read`` reads) up to
    ``GPU_TRAIN_PIPELINES`` for training, ``GPU_VIDEO_PIPELINES`` for val (see the module doc)."""
    if device != "gpu":
        return 1
    reads = batch_size // clips_per_read
    cap = GPU_TRAIN_PIPELINES if train else GPU_VIDEO_PIPELINES
    return max(k for k in range(1, min(cap, max(1, reads)) + 1) if reads % k == 0)


def read_batch_size(batch_size: int, clips_per_read: int, *, train: bool, pipelines: int | None = None) -> int:
    """DALI's batch for ``batch_size`` clips read ``clips_per_read`` at a time; a UsageError for values that
    do not fit (not a multiple, or val)."""
    if clips_per_read < 1:
        raise UsageError(f"clips_per_read (--clips-per-read) must be positive, got {clips_per_read}")
    if clips_per_read > 1 and not train:
        raise UsageError(f"clips_per_read={clips_per_read} is for training (clips shuffled); val reads clips in file "
                         "order, where the reader decodes on from one clip to the next anyway: leave it at 1 there")
    if batch_size % clips_per_read:
        raise UsageError(f"batch size {batch_size} is not a multiple of clips_per_read (--clips-per-read) "
                         f"{clips_per_read}: a batch holds whole reads of {clips_per_read} clips")
    reads = batch_size // clips_per_read
    if clips_per_read > 1 and pipelines is not None and pipelines >= 1 and reads % pipelines:
        raise UsageError(f"batch size {batch_size} is {reads} reads of clips_per_read={clips_per_read} clips, which "
                         f"pipelines={pipelines} (--pipelines) cannot share: make the reads a multiple of the pipelines")
    return reads


@dataclass(frozen=True)
class VideoInfo:
    """What PyAV reads from a file's container without decoding it."""

    path: str
    codec: str
    width: int
    height: int
    num_frames: int
    fps: float
    constant_frame_rate: bool
    #: frames from one key frame to the next (the median gap; the file's length with one key frame), None unprobed
    key_frame_interval: int | None = None


class OpticalFlowUnavailable(RuntimeError):
    """``fn.optical_flow`` cannot run here: it needs an NVIDIA GPU with the optical-flow engine."""


#: re-encode output suffix -> (codec, FFmpeg encoder, default CRF, encoder options): the one table behind
#: ``crossdali.video.reencode`` (through PyAV) and the ffmpeg command the errors print, so both encode alike.
#: x264 at ``veryfast``: what the H.264 rows of ``benchmarks/video_decode.py`` were measured on.
ENCODERS = {
    ".webm": ("VP9", "libvpx-vp9", 32, {"b:v": "0", "row-mt": "1", "deadline": "realtime", "cpu-used": "8"}),
    ".mp4": ("H.264", "libx264", 23, {"preset": "veryfast"}),
}


def encoder_settings(suffix: str, *, crf: int | None = None, key_every: int | None = None) -> tuple[str, dict[str, str]]:
    """The FFmpeg encoder and its options for a ``.webm`` (VP9) or ``.mp4`` (H.264) output; with
    ``key_every``, a key frame every ``key_every`` frames and nowhere else."""
    _, encoder, default_crf, options = ENCODERS[suffix]
    options = {**options, "crf": str(default_crf if crf is None else crf)}
    if key_every is not None:
        # g / keyint_min: libx264's keyint / min-keyint and libvpx's kf_max_dist / kf_min_dist
        options |= {"g": str(key_every), "keyint_min": str(key_every)}
        if encoder == "libx264":
            options["sc_threshold"] = "0"  # no key frames at scene cuts: they would shift the later ones
    return encoder, options


def reencode_command(src: str | Path, *, fps: int = 25, key_every: int | None = None, h264: bool = False) -> str:
    """The command that turns ``src`` into a constant-frame-rate VP9 WebM that DALI reads on CPU and
    GPU, or (``h264``, or with ``key_every``) an H.264 MP4 for NVDEC, with a key frame every ``key_every``
    frames if given: what the GPU loaders read shuffled clips fastest from (a key frame at every clip start)."""
    suffix = ".mp4" if h264 or key_every is not None else ".webm"
    encoder, options = encoder_settings(suffix, key_every=key_every)
    keys = f" --key-every {key_every}" if key_every is not None else ""
    dst = Path(src).with_suffix(suffix)
    if dst == Path(src):
        dst = Path(src).with_name(Path(src).stem + "_cfr" + suffix)
    flags = " ".join(f"-{name} {value}" for name, value in options.items())
    return (f"python -m crossdali.video.reencode {src} {dst} --fps {fps}{keys}   "
            f"(or: ffmpeg -i {src} -vf fps={fps} -c:v {encoder} {flags} -pix_fmt yuv420p -an {dst})")


def reencode_hint(path: str | Path, *, fps: float | None = None, key_every: int | None = None,
                  h264: bool = False) -> str:
    return reencode_command(path, fps=round(fps) if fps else 25, key_every=key_every, h264=h264)


def probe_video(path: str | Path) -> VideoInfo:
    """Codec, size, frame count and frame-rate regularity of ``path`` (demuxes, never decodes).

    Raises ``DataError`` naming the file when it is missing or not a readable video.
    """
    path = str(path)
    if not Path(path).is_file():
        raise DataError(f"video file {path} does not exist: fix the path in the file list or remove that line")
    try:
        import av
    except ImportError:
        raise ImportError("checking video files needs PyAV: pip install av (or pass validate=False)") from None
    try:
        container = av.open(path)
    except (av.error.FFmpegError, UnicodeDecodeError) as e:
        raise DataError(f"{path} is not a video file FFmpeg can read ({e}); remove it from the file list, "
                        "or re-encode the original to VP9 WebM: " + reencode_hint(path)) from None
    with container:
        if not container.streams.video:
            raise DataError(f"{path} holds no video stream (only {[s.type for s in container.streams]}); "
                            "remove it from the file list")
        stream = container.streams.video[0]
        codec = stream.codec_context.name
        fps = float(stream.average_rate or stream.guessed_rate or 0)
        pts, key_pts = [], []
        try:
            for packet in container.demux(stream):
                if packet.pts is not None and packet.size:
                    pts.append(packet.pts)
                    if packet.is_keyframe:
                        key_pts.append(packet.pts)
        except av.error.FFmpegError as e:
            raise DataError(f"{path} is damaged ({e}); re-encode it: " + reencode_hint(path, fps=fps)) from None
    if not pts:
        raise DataError(f"{path} holds no video frames; remove it from the file list")
    head = sorted(pts[:_VFR_PACKETS])  # presentation order (B-frames arrive out of order)
    durations = [b - a for a, b in itertools.pairwise(head)]
    cfr = True
    if len(durations) >= 2:
        med = sorted(durations)[len(durations) // 2]
        cfr = med > 0 and max(durations) - min(durations) <= max(1, _VFR_TOLERANCE * med)
    return VideoInfo(path=path, codec=codec, width=stream.width, height=stream.height, num_frames=len(pts),
                     fps=fps, constant_frame_rate=cfr, key_frame_interval=_key_frame_interval(pts, key_pts))


def _key_frame_interval(pts: list[int], key_pts: list[int]) -> int:
    """The median number of frames from one key frame to the next (frames in presentation order);
    the file's frame count when it has a single key frame."""
    order = {p: i for i, p in enumerate(sorted(pts))}
    keys = sorted(order[p] for p in set(key_pts))
    gaps = [b - a for a, b in itertools.pairwise(keys)]
    return sorted(gaps)[len(gaps) // 2] if gaps else len(pts)


def _info_problem(info: VideoInfo, *, device: str, transform: ClipTransform | None) -> tuple[str, str] | None:
    """(code, message naming the file and the fix) for a probed file the reader would decode
    wrongly or skip silently, or None."""
    codecs = CPU_CODECS if device == "cpu" else GPU_CODECS
    if info.codec not in codecs:
        where = ("DALI decodes only VP8, VP9 and MJPEG on the CPU (H.264/HEVC/AV1 need a GPU's NVDEC: "
                 "use device='gpu' / --data-backend dali-gpu there)") if device == "cpu" else \
            f"DALI's GPU reader decodes {sorted(GPU_CODECS)}"
        return "video-codec", (f"{info.path} is {info.codec}; {where}. Re-encode it to VP9: "
                               + reencode_hint(info.path, fps=info.fps))
    min_side = GPU_MIN_SIDE.get(info.codec, 0) if device != "cpu" else 0
    if min(info.width, info.height) < min_side:
        return "video-size", (
            f"{info.path} is {info.width}x{info.height} {info.codec}; the GPU's NVDEC decodes {info.codec} "
            f"from {min_side}x{min_side} up. Upscale it, e.g. `ffmpeg -i {info.path} -vf "
            f"scale={max(min_side, info.width)}:{max(min_side, info.height)} -c:v libvpx-vp9 -b:v 0 -crf 30 "
            "OUT.webm`, or decode it on the CPU (device='cpu' / --data-backend dali-cpu).")
    if not info.constant_frame_rate:
        problem = (f"{info.path} has a variable frame rate: DALI's reader takes frames by count, so its clips "
                   "would cover uneven stretches of time. Re-encode it at a constant frame rate")
        if device != "cpu" and info.codec in LEGACY_READER_CODECS:
            # on the GPU keep H.264 (VP9 would move training to the reader that is 10x slower shuffled),
            # with a key frame at every clip start (module docstring) where the clip step is known
            if transform is None:
                return "video-vfr", (f"{problem}, in H.264 (for training add --key-every with the clip step, the clip "
                                     "length x stride, so that NVDEC starts every shuffled clip at a key frame): "
                                     + reencode_hint(info.path, fps=info.fps, h264=True))
            return "video-vfr", (f"{problem}, in H.264 with a key frame at every clip start (NVDEC reads shuffled "
                                 "clips fastest from those): "
                                 + reencode_hint(info.path, fps=info.fps, key_every=transform.read.clip_step))
        return "video-vfr", f"{problem}: " + reencode_hint(info.path, fps=info.fps)
    # the experimental reader's rule, the stricter one: every file accepted gives both readers a clip
    if transform is not None and info.num_frames < transform.frames_needed:
        return "video-short", (f"{info.path} has {info.num_frames} frames but a clip needs {transform.frames_needed} "
                               f"(sequence_length={transform.sequence_length} x stride={transform.stride}); it "
                               "would yield no clip. Lower --clip-len/--frame-stride or remove the file.")
    if transform is not None and info.num_frames < transform.read.frames_needed:
        return "video-short", (f"{info.path} has {info.num_frames} frames but a read of clips_per_read="
                               f"{transform.clips_per_read} clips needs {transform.read.frames_needed}; it would yield "
                               "no clip. Lower --clips-per-read or remove the file.")
    return None


def _probe_or_problem(path: str) -> VideoInfo | DataError:
    try:
        return probe_video(path)
    except DataError as e:
        return e


def video_problems(files: Sequence[str], *, device: str, transform: ClipTransform | None = None,
                   threads: int = 8) -> list[tuple[str, str, str]]:
    """``(file, code, message)`` for every file ``check_videos`` would refuse (all of them, not the first)."""
    with ThreadPoolExecutor(max(1, min(threads, len(files) or 1))) as pool:
        results = list(pool.map(_probe_or_problem, files))
    problems = []
    for path, res in zip(files, results):
        if isinstance(res, DataError):
            problems.append((path, "not-a-video", str(res)))
            continue
        found = _info_problem(res, device=device, transform=transform)
        if found is not None:
            problems.append((path, *found))
    return problems


def check_videos(files: Sequence[str], *, device: str, transform: ClipTransform | None = None,
                 threads: int = 8) -> list[VideoInfo]:
    """Probe every file and raise ``DataError`` (naming the file and the fix) for one that the
    reader would decode wrongly or skip silently: missing, not a video, a codec the device cannot
    decode, a variable frame rate, or fewer frames than one clip needs."""
    if not files:
        raise DataError("no video files given")
    with ThreadPoolExecutor(max(1, min(threads, len(files)))) as pool:
        infos = list(pool.map(probe_video, files))
    for info in infos:
        found = _info_problem(info, device=device, transform=transform)
        if found is not None:
            raise DataError(found[1])
    return infos


def clips_per_epoch(infos: Sequence[VideoInfo], transform: ClipTransform, *, reader: str = "experimental") -> int:
    """Clips ``reader`` cuts from these files: starts 0, step, 2*step, ... while ``frames_needed`` remain
    (with ``clips_per_read`` > 1: reads of that many clips, each cut by the same rule, times the clips in a read)."""
    read = transform.read
    need = read.frames_needed_by(reader)
    reads = sum((i.num_frames - need) // read.clip_step + 1 for i in infos if i.num_frames >= need)
    return reads * transform.clips_per_read


def _first_codec(path: str) -> str | None:
    """The first video stream's codec from the container header (no demuxing), None without PyAV."""
    try:
        import av
    except ImportError:
        return None
    try:
        with av.open(path) as container:
            return container.streams.video[0].codec_context.name if container.streams.video else None
    except (av.error.FFmpegError, OSError):
        return None  # the reader itself reports the file


def count_clips(source: DataSource, *, device: str, transform: ClipTransform, shuffle: bool = True,
                validate: bool = True) -> tuple[int, str]:
    """``(clips per epoch, reader)`` for a loader over ``source``'s files, clips shuffled (train) or
    in file order (val). ``validate`` probes every file (``check_videos``); without it the first
    file's codec picks the reader and the count is ``source.num_samples`` (a lower bound: the files
    are not read)."""
    if not validate:
        codec = _first_codec(source.files[0]) if source.files else None
        return source.num_samples, clip_reader(device, [codec] if codec else [], shuffle=shuffle)
    infos = check_videos(source.files, device=device, transform=transform)
    reader = clip_reader(device, (i.codec for i in infos), shuffle=shuffle)
    clips = clips_per_epoch(infos, transform, reader=reader)
    if reader == "legacy" and transform.clips_per_read == 1:
        _hint_clips_per_read(source, infos, transform)
    if transform.clips_per_read > 1:
        single = clips_per_epoch(infos, replace(transform, clips_per_read=1), reader=reader)
        if single > clips:  # not silent: the files' last clips that do not fill a read are not read
            log.warning("%s: clips_per_read=%d gives %d clips an epoch where reading one clip at a time gives %d: the "
                        "last %d clips of some files do not fill a read and are not read (files of a multiple of %d "
                        "frames lose none)", source.root, transform.clips_per_read, clips, single, single - clips,
                        transform.read.clip_step)
    return clips, reader


def _hint_clips_per_read(source: DataSource, infos: Sequence[VideoInfo], transform: ClipTransform) -> None:
    """Say once per loader when shuffled clips on NVDEC would each decode from a key frame several clips
    back, and what reads it at the hardware's rate instead (module doc: 1,750 -> 4,600 frames/s)."""
    intervals = sorted(i.key_frame_interval for i in infos if i.key_frame_interval)
    if not intervals:
        return
    interval, step = intervals[len(intervals) // 2], transform.clip_step
    k = interval // step
    if k < 2:
        return
    log.warning("%s: the videos have a key frame every %d frames (median) and a clip starts every %d, so NVDEC decodes "
                "each shuffled clip from the key frame up to %d frames before it. clips_per_read=%d (--clips-per-read "
                "%d) decodes %d clips from one key frame at once (on the H100, 1080p H.264 with key frames 48 apart: "
                "1,750 -> 4,600 frames/s; their crop, flip and batch are shared, docs/video.md), or re-encode with a "
                "key frame at every clip start: python -m crossdali.video.reencode IN OUT.mp4 --key-every %d",
                source.root, interval, step, interval - step, k, k, k, step)


class ClipCounter:
    """``prepare_split``'s ``count`` for a clip loader: ``count_clips`` on the split's source, keeping
    the reader it picked in ``reader`` so the loader's pipelines read with the one the count is for."""

    def __init__(self, *, device: str, transform: ClipTransform, shuffle: bool, validate: bool) -> None:
        self.device, self.transform, self.shuffle, self.validate = device, transform, shuffle, validate
        self.reader: str | None = None  # set by the call (prepare_split counts before pipelines are built)

    def __call__(self, source: DataSource) -> int:
        """DALI samples per epoch: clips, or reads of ``clips_per_read`` clips."""
        clips, self.reader = count_clips(source, device=self.device, transform=self.transform,
                                         shuffle=self.shuffle, validate=self.validate)
        return clips // self.transform.clips_per_read if self.validate else clips


def resolve_video_source(data: str | Path, split: str, *, exclude=None) -> DataSource:
    """The ``split`` of a video dataset: a file list (``<path> <label>`` per line), a folder with
    ``<split>.txt``, or a folder with ``<split>/<class>/<video>`` (classes sorted by name).
    ``exclude`` (the exclusion list ``crossdali check`` writes, or paths) leaves files out."""
    exclusions = load_exclusions(exclude)
    source = _resolve_video_source(Path(data), split)
    if not exclusions:
        return source
    keep = [i for i, f in enumerate(source.files) if not exclusions.excludes_file(f)]
    log.warning("%s: excluded %d of %d videos listed in %s", source.root, source.num_samples - len(keep),
                source.num_samples, exclusions.origin or "exclude=")
    if not keep:
        raise DataError(f"{source.root}: the exclusion list excludes every video; nothing to train on")
    return replace(source, files=tuple(source.files[i] for i in keep), labels=tuple(source.labels[i] for i in keep),
                   num_samples=len(keep))


def _resolve_video_source(data: Path, split: str) -> DataSource:
    if data.is_file():
        return read_file_list(data, validate=False)
    if not data.is_dir():
        raise DataError(f"video dataset {data} does not exist: pass a folder with {split}.txt or "
                        f"{split}/<class>/<video>, or a file list")
    listed = data / f"{split}.txt"
    if listed.is_file():
        src = read_file_list(listed, validate=False)
        classes = _manifest_classes(data)
        if classes:
            src = DataSource(format="filelist", root=src.root, files=src.files, labels=src.labels,
                             classes=tuple(classes), num_samples=src.num_samples)
        return src
    folder = data / split
    if not folder.is_dir():
        raise DataError(f"{data} holds neither {split}.txt nor a {split}/ folder of <class>/<video> files")
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    files, labels = [], []
    for label, name in enumerate(classes):
        for f in sorted((folder / name).iterdir()):
            if f.suffix.lower() in VIDEO_EXTENSIONS:
                files.append(str(f))
                labels.append(label)
    if not files:
        raise DataError(f"{folder} holds no videos ({', '.join(VIDEO_EXTENSIONS)}) in <class>/ sub-folders")
    return DataSource(format="filelist", root=folder, files=tuple(files), labels=tuple(labels),
                      classes=tuple(classes), num_samples=len(files))


def _manifest_classes(folder: Path) -> list[str]:
    import json

    try:
        return list(json.loads((folder / "manifest.json").read_text())["classes"])
    except (OSError, ValueError, KeyError):
        return []


def _video_reader(files: Sequence[str], labels: Sequence[int], *, sequence_length: int, stride: int,
                  step: int, shuffle: bool, opts: PipelineOptions, frame_num: bool = False,
                  reader: str = "experimental"):
    from nvidia.dali import fn  # defer: keeps `import crossdali.common` light

    common = dict(filenames=list(files), labels=list(labels), sequence_length=sequence_length, stride=stride,
                  step=step, random_shuffle=shuffle, initial_fill=opts.initial_fill, seed=opts.seed,
                  shard_id=opts.shard_id, num_shards=opts.num_shards, pad_last_batch=True,
                  enable_frame_num=frame_num, name=VIDEO_READER_NAME)
    if reader == "legacy":
        if opts.device != "gpu":
            raise ValueError("the legacy video reader (fn.readers.video) runs on the GPU only")
        # file_list_include_preceding_frame only matters for file lists with timestamps; set, it
        # silences a warning the reader prints per instance
        return fn.readers.video(device="gpu", file_list_include_preceding_frame=True, **common)
    if reader != "experimental":
        raise ValueError(f"reader must be 'legacy' or 'experimental', got {reader!r}")
    return fn.experimental.readers.video(device="gpu" if opts.device == "gpu" else "cpu", **common)


def create_clip_pipeline(
    source: DataSource,
    *,
    train: bool,
    options: PipelineOptions,
    transform: ClipTransform | None = None,
    with_frame_num: bool = False,
    validate: bool = True,
    reader: str | None = None,
):
    """Build (but do not start) the train or val clip pipeline over ``source`` (a file list).

    Outputs ``(clips, labels)``, plus ``frame_num`` (int32 ``(1,)``: the clip's first frame) with
    ``with_frame_num``. ``validate`` probes every file first (see ``check_videos``); turn it off
    only for datasets already checked. ``reader``: ``"legacy"`` or ``"experimental"``; ``None``
    picks it as ``count_clips`` does (loaders pass the one they counted with).
    """
    from nvidia.dali import fn, pipeline_def, types  # defer

    t = transform or ClipTransform()
    opts = options
    if not source.files:
        raise DataError(f"{source.root}: the video pipeline reads file lists; got a {source.format} source")
    if reader is None:
        _, reader = count_clips(source, device=opts.device, transform=t, shuffle=train, validate=validate)
    elif validate:
        check_videos(source.files, device=opts.device, transform=t)
    dtype = types.FLOAT16 if t.dtype == "float16" else types.FLOAT
    k = t.clips_per_read
    if k > 1 and not train:
        raise ValueError(f"clips_per_read={k} is for training (clips shuffled); val reads clips in file order, where "
                         "the reader decodes on from one clip to the next anyway: leave it at 1 there")

    @pipeline_def(**opts.pipeline_kwargs())
    def clip_pipeline():
        read = t.read
        out = _video_reader(source.files, source.labels, sequence_length=read.sequence_length, stride=t.stride,
                            step=read.clip_step, shuffle=train, opts=opts, frame_num=with_frame_num, reader=reader)
        clips, labels = out[0], out[1]
        if train:
            clips = fn.random_resized_crop(clips, size=(t.crop_size, t.crop_size),
                                           random_area=list(t.random_area),
                                           random_aspect_ratio=list(t.random_aspect_ratio),
                                           interp_type=types.INTERP_LINEAR, antialias=True)
            mirror = fn.random.coin_flip(probability=t.hflip) if t.hflip > 0 else False
        else:
            clips = fn.resize(clips, resize_shorter=t.val_resize_size, interp_type=types.INTERP_LINEAR,
                              antialias=True)
            mirror = False
        clips = fn.crop_mirror_normalize(clips, dtype=dtype, output_layout=t.output_layout,
                                         crop=(t.crop_size, t.crop_size), mean=list(t.mean), std=list(t.std),
                                         mirror=mirror)
        labels = fn.cast(labels, dtype=types.INT64)
        if k > 1:  # a read of k clips -> (k, clip...): the loader unfolds (N, k, ...) batches into (N * k, ...)
            clips = _split_read(clips, t)
            labels = fn.cat(*[labels] * k)
        outputs = [clips, labels.gpu() if opts.device == "gpu" and labels.device == "cpu" else labels]
        if with_frame_num:
            frame_num = out[2]
            if k > 1:
                frame_num = fn.cat(*[frame_num + i * t.clip_step for i in range(k)])
            outputs.append(frame_num.gpu() if opts.device == "gpu" and frame_num.device == "cpu" else frame_num)
        return tuple(outputs)

    return clip_pipeline()


def _split_read(clips, t: ClipTransform):
    """One read's ``clips_per_read * sequence_length`` frames as ``clips_per_read`` clips in ``t``'s layout:
    ``(k, F, H, W, C)`` from FHWC (a reshape), ``(k, C, F, H, W)`` from CFHW (a reshape and a transpose)."""
    from nvidia.dali import fn  # defer

    k, f, c = t.clips_per_read, t.sequence_length, t.crop_size
    if t.output_layout == "FHWC":
        return fn.reshape(clips, shape=[k, f, c, c, 3], layout="NFHWC")
    return fn.transpose(fn.reshape(clips, shape=[3, k, f, c, c], layout="CNFHW"), perm=[1, 0, 2, 3, 4])


def _compute_capability(device_id: int) -> tuple[int, int] | None:
    """(major, minor) of GPU ``device_id`` from the CUDA driver, or None without a driver."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    dev, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(dev), device_id) != 0:
        return None
    cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)  # ..._MINOR
    return major.value, minor.value


_OF_NEEDS = ("DALI's optical flow runs only on the optical-flow engine of an NVIDIA GPU of the Turing "
             "generation or newer (compute capability 7.5+, e.g. T4, RTX 20xx/30xx/40xx, A10, A100, L4, H100); "
             "there is no CPU implementation")


def require_optical_flow_hardware(device: str, device_id: int | None) -> None:
    """Raise ``OpticalFlowUnavailable`` unless ``device_id`` is a GPU with an optical-flow engine."""
    if device != "gpu" or device_id is None:
        raise OpticalFlowUnavailable(f"{_OF_NEEDS}; this run asked for device={device!r}. Run it on such a GPU "
                                     "with device='gpu' and a device_id.")
    from nvidia.dali.backend import GetCUDADeviceCount

    count = GetCUDADeviceCount()
    if count <= device_id:
        raise OpticalFlowUnavailable(f"{_OF_NEEDS}; this machine shows {count} CUDA GPU(s), so GPU {device_id} "
                                     "does not exist. Run it on a machine with such a GPU.")
    cc = _compute_capability(device_id)
    if cc is not None and cc < (7, 5):
        raise OpticalFlowUnavailable(f"{_OF_NEEDS}; GPU {device_id} has compute capability {cc[0]}.{cc[1]}.")


def create_optical_flow_pipeline(
    files: Sequence[str],
    *,
    options: PipelineOptions,
    labels: Sequence[int] | None = None,
    sequence_length: int = 2,
    stride: int = 1,
    step: int | None = None,
    flow_size: int | None = 256,
    output_grid: int = 4,
    preset: float = 0.5,
    validate: bool = True,
):
    """Frames and the optical flow between consecutive frames of clips read from ``files`` (GPU).

    Outputs ``(frames, flow, labels)``: uint8 ``(F, H, W, 3)`` frames as decoded, float32
    ``(F-1, S/grid, S/grid, 2)`` flow (x, y) and the int64 labels. With ``flow_size=S`` the frames
    are resized to S x S before the flow engine (the same grid for every file, and enough blocks
    for small frames), so the vectors are in pixels of that S x S image:
    ``flow_to_frame_pixels`` scales them back. Raises ``OpticalFlowUnavailable`` where there is
    no GPU with an optical-flow engine.
    """
    from nvidia.dali import fn, pipeline_def, types  # defer

    require_optical_flow_hardware(options.device, options.device_id)
    if sequence_length < 2:
        raise ValueError(f"optical flow needs at least 2 frames per sequence, got sequence_length={sequence_length}")
    if output_grid not in (1, 2, 4):
        raise ValueError(f"output_grid must be 1, 2 or 4 (4 only on Turing), got {output_grid}")
    files = list(files)
    labels = list(labels) if labels is not None else [0] * len(files)
    sampling = ClipTransform(sequence_length=sequence_length, stride=stride, step=step)
    if validate:
        check_videos(files, device="gpu", transform=sampling)
    opts = options

    @pipeline_def(batch_size=opts.batch_size, num_threads=opts.num_threads, device_id=opts.device_id,
                  seed=opts.seed, prefetch_queue_depth=opts.prefetch_queue_depth)
    def optical_flow_pipeline():
        frames, lbl = _video_reader(files, labels, sequence_length=sequence_length, stride=stride,
                                    step=sampling.clip_step, shuffle=False, opts=opts)
        flow_in = frames
        if flow_size:
            flow_in = fn.resize(frames, size=(flow_size, flow_size), interp_type=types.INTERP_LINEAR)
        flow = fn.optical_flow(flow_in, output_grid=output_grid, preset=preset,
                               enable_temporal_hints=sequence_length > 2)
        return frames, flow, fn.cast(lbl, dtype=types.INT64)

    return optical_flow_pipeline()


def flow_to_frame_pixels(flow, frame_hw: tuple[int, int], flow_size: int | None):
    """Flow from ``create_optical_flow_pipeline`` as the motion of the content from frame i to frame
    i+1, in pixels of the decoded ``(H, W)`` frames (x right, y down).

    DALI's raw vectors point the other way, from frame i+1 back to frame i (the optical-flow
    engine's input-to-reference convention): measured on the H100 with clips whose motion is known
    (``tests/video/test_video_gpu.py``: a rising patch gave dy > 0 raw), so the sign is flipped here."""
    if not flow_size:
        return -flow
    h, w = frame_hw
    scale = flow.dtype.type(w / flow_size), flow.dtype.type(h / flow_size)
    return flow * [-scale[0], -scale[1]]


def explain_video_failure(source: DataSource, error: Exception, *, device: str = "cpu") -> Exception:
    """Turn a DALI reader error into one that names the file and the fix (probes the files)."""
    try:
        check_videos(source.files, device=device)
    except DataError as e:
        return e
    msg = str(error)
    if "number of input samples: 0" in msg:
        return DataError(f"DALI's video reader found no clip in {source.root} ({len(source.files)} files): "
                         "every file is shorter than one clip, or DALI cannot decode them on this device. "
                         f"Lower the clip length/stride, or re-encode to VP9: {reencode_hint(source.files[0])}")
    return error
