"""Video files: which codecs DALI decodes on which device, what a file holds (probed with PyAV,
never decoded), the problems the reader would hit with it, the commands that re-encode it, a
split's file list, and how many clips a reader cuts from the files.

The files are checked before any pipeline is built, because DALI's reader reports a file it cannot
decode late and vaguely: on the CPU (which decodes only VP8, VP9 and MJPEG) an H.264 file reads as
"number of input samples: 0". So an H.264 file on the CPU path fails here, with an error that names
the codec and the re-encode command (no PyAV decode fallback: it would be a second, slower decoder
to keep equal to DALI's).
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from crossdali.common.data.check.exclude import load_exclusions
from crossdali.common.data.sources import DataSource, read_file_list
from crossdali.common.errors import DataError

__all__ = [
    "CPU_CODECS",
    "ENCODERS",
    "GPU_CODECS",
    "LEGACY_READER_CODECS",
    "VIDEO_EXTENSIONS",
    "ClipCounter",
    "ClipGeometry",
    "VideoInfo",
    "check_videos",
    "clip_reader",
    "clips_per_epoch",
    "count_clips",
    "encoder_settings",
    "probe_video",
    "reencode_command",
    "reencode_hint",
    "resolve_video_source",
    "video_problems",
]

log = logging.getLogger(__name__)

#: Codecs DALI 2.4 decodes on the CPU (FFmpeg names). The GPU adds h264, hevc, av1, mpeg4.
CPU_CODECS = frozenset({"vp8", "vp9", "mjpeg"})
GPU_CODECS = CPU_CODECS | {"h264", "hevc", "av1", "mpeg4"}
#: Codecs the GPU reads with the legacy ``fn.readers.video`` when a whole dataset has them (``clip_reader``).
LEGACY_READER_CODECS = frozenset({"h264", "hevc"})
#: NVDEC's smallest frame per codec where it is larger than the sample clips (DALI 2.4: a 64x64 VP9
#: clip fails with "Video is too small ... supported:128x128"; 64x64 H.264 decodes).
GPU_MIN_SIDE = {"vp9": 128}
VIDEO_EXTENSIONS = (".webm", ".mp4", ".mkv", ".avi", ".mov", ".m4v")
# A stream is constant-frame-rate when its frame durations differ by at most this share of the
# median (plus one time-base tick for rounding, e.g. 33/34 ms at 30 fps in WebM's 1/1000 s).
_VFR_TOLERANCE = 0.05
_VFR_PACKETS = 300  # frame durations checked per file: enough to catch VFR, cheap on long files


class ClipGeometry(Protocol):
    """What the checks and the clip count need of a clip preset (``crossdali.common.video.ClipTransform``):
    how many frames a clip takes and where the next one starts."""

    sequence_length: int
    stride: int
    clips_per_read: int

    @property
    def frames_needed(self) -> int: ...

    @property
    def clip_step(self) -> int: ...

    @property
    def read(self) -> ClipGeometry: ...

    def frames_needed_by(self, reader: str) -> int: ...


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


def _info_problem(info: VideoInfo, *, device: str, transform: ClipGeometry | None) -> tuple[str, str] | None:
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


def video_problems(files: Sequence[str], *, device: str, transform: ClipGeometry | None = None,
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


def check_videos(files: Sequence[str], *, device: str, transform: ClipGeometry | None = None,
                 threads: int = 8, infos: Sequence[VideoInfo] | None = None) -> list[VideoInfo]:
    """Probe every file and raise ``DataError`` (naming the file and the fix) for one that the
    reader would decode wrongly or skip silently: missing, not a video, a codec the device cannot
    decode, a variable frame rate, or fewer frames than one clip needs. ``infos``: these files
    already probed (checked again for ``transform``, not probed again)."""
    if not files:
        raise DataError("no video files given")
    if infos is None:
        with ThreadPoolExecutor(max(1, min(threads, len(files)))) as pool:
            infos = list(pool.map(probe_video, files))
    infos = list(infos)
    for info in infos:
        found = _info_problem(info, device=device, transform=transform)
        if found is not None:
            raise DataError(found[1])
    return infos


def clip_reader(device: str, codecs, *, shuffle: bool = True) -> str:
    """``"legacy"`` (``fn.readers.video``) for shuffled clips on the GPU when every codec is in
    ``LEGACY_READER_CODECS``, else ``"experimental"`` (``fn.experimental.readers.video``): clips in
    file order (val) read faster with the experimental reader (``crossdali.common.video``)."""
    codecs = set(codecs)
    legacy = shuffle and device == "gpu" and codecs and codecs <= LEGACY_READER_CODECS
    return "legacy" if legacy else "experimental"


def clips_per_epoch(infos: Sequence[VideoInfo], transform: ClipGeometry, *, reader: str = "experimental") -> int:
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


def count_clips(source: DataSource, *, device: str, transform: ClipGeometry, shuffle: bool = True,
                validate: bool = True, infos: Sequence[VideoInfo] | None = None) -> tuple[int, str]:
    """``(clips per epoch, reader)`` for a loader over ``source``'s files, clips shuffled (train) or
    in file order (val). ``validate`` probes every file (``check_videos``); without it the first
    file's codec picks the reader and the count is ``source.num_samples`` (a lower bound: the files
    are not read). ``infos``: ``source``'s files already probed (``check_videos``)."""
    if not validate:
        codec = _first_codec(source.files[0]) if source.files else None
        return source.num_samples, clip_reader(device, [codec] if codec else [], shuffle=shuffle)
    infos = check_videos(source.files, device=device, transform=transform, infos=infos)
    reader = clip_reader(device, (i.codec for i in infos), shuffle=shuffle)
    clips = clips_per_epoch(infos, transform, reader=reader)
    if reader == "legacy" and transform.clips_per_read == 1:
        _hint_clips_per_read(source, infos, transform)
    if transform.clips_per_read > 1:
        single = clips_per_epoch(infos, replace(transform, clips_per_read=1), reader=reader)
        if single > clips:  # not silent: the files' last clips that do not fill a read are not read
            log.warning("%s: clips_per_read=%d gives %d clips an epoch where reading one clip at a time gives %d: the "
                        "last %d clips of some files do not fill a read and are not read (files of a multiple of %d "
                        "frames lose none; clips_per_read=1, --clips-per-read 1, reads them all)",
                        source.root, transform.clips_per_read, clips, single, single - clips,
                        transform.read.clip_step)
    return clips, reader


def _hint_clips_per_read(source: DataSource, infos: Sequence[VideoInfo], transform: ClipGeometry) -> None:
    """Say once per loader when shuffled clips on NVDEC would each decode from a key frame several clips
    back, and what reads it at the hardware's rate instead (docs/benchmarks.md#video-decoding)."""
    intervals = sorted(i.key_frame_interval for i in infos if i.key_frame_interval)
    if not intervals:
        return
    interval, step = intervals[len(intervals) // 2], transform.clip_step
    k = interval // step
    if k < 2:
        return
    log.warning("%s: the videos have a key frame every %d frames (median) and a clip starts every %d, so NVDEC decodes "
                "each shuffled clip from the key frame up to %d frames before it. clips_per_read=%d (--clips-per-read "
                "%d) decodes %d clips from one key frame at once (each keeps its own crop and flip; they share a batch: "
                "docs/video.md; "
                "docs/benchmarks.md#video-decoding has the rates), or re-encode with a "
                "key frame at every clip start: python -m crossdali.video.reencode IN OUT.mp4 --key-every %d",
                source.root, interval, step, interval - step, k, k, k, step)


class ClipCounter:
    """``prepare_split``'s ``count`` for a clip loader: ``count_clips`` on the split's source, keeping
    the reader it picked in ``reader`` so the loader's pipelines read with the one the count is for."""

    def __init__(self, *, device: str, transform: ClipGeometry, shuffle: bool, validate: bool,
                 infos: Sequence[VideoInfo] | None = None) -> None:
        self.device, self.transform, self.shuffle, self.validate = device, transform, shuffle, validate
        self.infos = infos  #: the split's files already probed, or None
        self.reader: str | None = None  # set by the call (prepare_split counts before pipelines are built)

    def __call__(self, source: DataSource) -> int:
        """DALI samples per epoch: clips, or reads of ``clips_per_read`` clips."""
        clips, self.reader = count_clips(source, device=self.device, transform=self.transform,
                                         shuffle=self.shuffle, validate=self.validate, infos=self.infos)
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
    try:
        return list(json.loads((folder / "manifest.json").read_text())["classes"])
    except (OSError, ValueError, KeyError):
        return []
