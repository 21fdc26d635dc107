"""The video clip pipeline, defined once for every framework (DALI functional API).

DALI's video reader cuts each file into clips of ``sequence_length`` frames, ``stride`` frames
apart, a new clip every ``step`` frames. train: clips in random order, one random-resized crop
window and one coin-flip mirror per clip (the same for all of its frames), normalize. val: clips in
file order, resize the shorter side, centre crop, normalize, every clip exactly once across shards
(padded last batch, dropped by the iterator). Output per sample: ``FHWC`` or ``CFHW`` float
(batches ``NFHWC`` / ``NCFHW``) and an int64 label of shape ``(1,)``.

Which reader (``crossdali.common.data.videos.clip_reader``): shuffled clips (train) on the GPU, when
every file is H.264 or HEVC, are read by the legacy ``fn.readers.video``, which keeps NVDEC busy
where the experimental reader leaves it mostly idle on shuffled clips; everything else, val
included (in file order the experimental reader decodes on from one clip to the next), by
``fn.experimental.readers.video`` (FFmpeg on the CPU, NVDEC on the GPU). The legacy reader
checkpoints and resumes exactly, shards and pads like the other, and cuts a clip wherever its
``(sequence_length - 1) * stride + 1`` frames remain (the experimental one needs ``sequence_length
* stride``; the clip counts follow the reader). It has no CPU backend and refuses VP9 WebM, so
VP8/VP9/MJPEG/AV1/MPEG-4 files keep the experimental reader on both devices. The files are probed
before the pipeline is built (``crossdali.common.data.videos``). The rates behind these choices:
docs/benchmarks.md#video-decoding.

One reader leaves NVDEC mostly idle; several per process, each on a slice of the shard, keep it
busy: the loaders' ``pipelines=`` (``crossdali.common.options.sub_shard_options``: one pipeline per
slice, every clip once per epoch, one DALI checkpoint per pipeline). Its default on the GPU
(``default_video_pipelines``) is the largest divisor of the batch size up to ``GPU_TRAIN_PIPELINES``
in training and up to ``GPU_VIDEO_PIPELINES`` for val.

Several clips per read (``clips_per_read``, train): the reader cuts ``clips_per_read`` consecutive
clips as one sequence, so a file's frames are decoded once for all of them instead of once per
shuffled clip from the key frame before it; ``_per_clip`` slices the read into its clips and gives
each its own crop window and flip (DALI's random operators draw once per sample, and a sample is a
read), and the loader unfolds the reads of a batch into clips. The clips of a read arrive in the same
batch; reads are shuffled. Padding reads of a short last step are decoded too, so on a small set whole
steps read faster.

The optical-flow pipeline is ``crossdali.common.optical_flow``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from crossdali.common.data.sources import DataSource
from crossdali.common.data.videos import check_videos, count_clips, reencode_hint, resolve_video_source
from crossdali.common.errors import DataError, UsageError
from crossdali.common.options import PipelineOptions

__all__ = [
    "CPU_TRAIN_BATCH",
    "GPU_TRAIN_BATCH",
    "GPU_TRAIN_PIPELINES",
    "GPU_VIDEO_PIPELINES",
    "KINETICS_MEAN",
    "KINETICS_STD",
    "VIDEO_READER_NAME",
    "DEFAULT_CLIPS_PER_READ",
    "ClipTransform",
    "create_clip_pipeline",
    "default_clips_per_read",
    "default_video_batch_size",
    "default_video_pipelines",
    "explain_video_failure",
    "read_batch_size",
    "resolve_video_source",  # defined with the other video-file helpers in crossdali.common.data.videos
    "video_reader",
]

#: Name of the reader operator; iterators pass it as ``reader_name=`` to size epochs.
VIDEO_READER_NAME = "VideoReader"
# Kinetics-400 statistics (torchvision's video models), on the 0-255 scale DALI works in.
KINETICS_MEAN = (0.43216 * 255, 0.394666 * 255, 0.37645 * 255)
KINETICS_STD = (0.22803 * 255, 0.22145 * 255, 0.216989 * 255)
#: Most DALI pipelines per process the loaders start on the GPU for val by default (one per NVDEC engine
#: of a GPU with seven; docs/benchmarks.md#video-decoding).
GPU_VIDEO_PIPELINES = 7
#: The same for training (clips shuffled): two per engine, which kept them busiest
#: (docs/benchmarks.md#video-decoding).
GPU_TRAIN_PIPELINES = 14
#: Clips of one read in training by default (``clips_per_read=None``): 3 clips of 16 frames are the
#: 48 frames between the key frames of a set re-encoded for training, so each read decodes from its own
#: key frame once for all of its clips (docs/benchmarks.md#video-decoding).
DEFAULT_CLIPS_PER_READ = 3
#: The training script's ``-b`` where a CUDA GPU trains: one read of ``DEFAULT_CLIPS_PER_READ`` clips for each of
#: ``GPU_TRAIN_PIPELINES`` pipelines, so every pipeline decodes a step's read at once (fewer reads a step leave
#: NVDEC engines idle: docs/benchmarks.md#video-decoding). On the CPU: ``CPU_TRAIN_BATCH``, torchvision's
#: video reference batch.
GPU_TRAIN_BATCH = DEFAULT_CLIPS_PER_READ * GPU_TRAIN_PIPELINES
CPU_TRAIN_BATCH = 24


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


def default_video_batch_size(*, cuda: bool) -> int:
    """The training script's clips per process per step when ``-b`` is not given: ``GPU_TRAIN_BATCH`` where a
    CUDA GPU trains, ``CPU_TRAIN_BATCH`` on the CPU."""
    return GPU_TRAIN_BATCH if cuda else CPU_TRAIN_BATCH


def default_video_pipelines(device: str, batch_size: int, *, train: bool = True, clips_per_read: int = 1) -> int:
    """``pipelines=None`` of the video loaders: 1 on the CPU (more only split the same threads); on
    the GPU the largest divisor of DALI's batch (``batch_size / clips_per_read`` reads) up to
    ``GPU_TRAIN_PIPELINES`` for training, ``GPU_VIDEO_PIPELINES`` for val (see the module doc)."""
    if device != "gpu":
        return 1
    reads = batch_size // clips_per_read
    cap = GPU_TRAIN_PIPELINES if train else GPU_VIDEO_PIPELINES
    return max(k for k in range(1, min(cap, max(1, reads)) + 1) if reads % k == 0)


def default_clips_per_read(batch_size: int, *, train: bool, transform: ClipTransform,
                           num_frames: Sequence[int] = (), pipelines: int | None = None) -> int:
    """``clips_per_read=None`` of the video loaders: 1 for val (clips in file order decode on from one to
    the next anyway); in training the largest of ``DEFAULT_CLIPS_PER_READ`` .. 1 that divides ``batch_size``
    into whole reads (that ``pipelines``, if given, can share) and whose read the shortest file
    (``num_frames``: every file's frame count, if probed) holds, so the default never refuses a set
    that one clip per read accepts; 1 where clips do not touch (``step`` other than
    ``sequence_length * stride``), which reads cannot cut."""
    if not train or transform.clip_step != transform.sequence_length * transform.stride:  # reads: touching clips
        return 1
    shortest = min(num_frames, default=None)
    for k in range(DEFAULT_CLIPS_PER_READ, 1, -1):
        if batch_size % k or (pipelines and (batch_size // k) % pipelines):
            continue
        if shortest is not None and shortest < replace(transform, clips_per_read=k).read.frames_needed:
            continue
        return k
    return 1


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


def video_reader(files: Sequence[str], labels: Sequence[int], *, sequence_length: int, stride: int,
                 step: int, shuffle: bool, opts: PipelineOptions, frame_num: bool = False,
                 reader: str = "experimental"):
    """The DALI reader node of the clip and optical-flow pipelines: ``"legacy"`` (``fn.readers.video``,
    GPU only) or ``"experimental"`` (``fn.experimental.readers.video``), named ``VIDEO_READER_NAME``."""
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
    """Build (but do not start) the train or val clip pipeline over ``source`` (the module docstring
    says what each does).

    Args:
        source: a resolved file list of videos (``resolve_video_source``).
        train: clips shuffled with a random crop and flip per clip; or clips in file order, resized
            and centre-cropped, every clip once across shards.
        options: where and how the pipeline runs (device, threads, shard, seed, batch size in reads).
        transform: the clip preset (default: ``ClipTransform()``).
        with_frame_num: add ``frame_num`` (int32 ``(1,)``: the clip's first frame) as a third output.
        validate: probe every file first (``crossdali.common.data.videos.check_videos``); turn it off
            only for datasets already checked.
        reader: ``"legacy"`` or ``"experimental"``; ``None`` picks it as ``count_clips`` does (loaders
            pass the one they counted with).

    Returns:
        A ``nvidia.dali.Pipeline`` with outputs ``(clips, labels)`` (and ``frame_num``), its reader
        named ``VIDEO_READER_NAME``.
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
        out = video_reader(source.files, source.labels, sequence_length=read.sequence_length, stride=t.stride,
                            step=read.clip_step, shuffle=train, opts=opts, frame_num=with_frame_num, reader=reader)
        clips, labels = out[0], out[1]
        if train:  # each clip its own crop window and flip, also the clips of one read
            clips = _per_clip(clips, t, lambda clip: _train_clip(clip, t, dtype))
        else:
            clips = fn.resize(clips, resize_shorter=t.val_resize_size, interp_type=types.INTERP_LINEAR,
                              antialias=True)
            clips = fn.crop_mirror_normalize(clips, dtype=dtype, output_layout=t.output_layout,
                                             crop=(t.crop_size, t.crop_size), mean=list(t.mean), std=list(t.std))
        labels = fn.cast(labels, dtype=types.INT64)
        if k > 1:  # a read of k clips is (k, clip...): the loader unfolds (N, k, ...) batches into (N * k, ...)
            labels = fn.cat(*[labels] * k)
        outputs = [clips, labels.gpu() if opts.device == "gpu" and labels.device == "cpu" else labels]
        if with_frame_num:
            frame_num = out[2]
            if k > 1:
                frame_num = fn.cat(*[frame_num + i * t.clip_step for i in range(k)])
            outputs.append(frame_num.gpu() if opts.device == "gpu" and frame_num.device == "cpu" else frame_num)
        return tuple(outputs)

    return clip_pipeline()


def _train_clip(clip, t: ClipTransform, dtype):
    """One training clip: a random-resized crop window and a coin-flip mirror drawn once for the clip
    (the same for all of its frames), normalized into ``t``'s layout."""
    from nvidia.dali import fn, types  # defer

    clip = fn.random_resized_crop(clip, size=(t.crop_size, t.crop_size), random_area=list(t.random_area),
                                  random_aspect_ratio=list(t.random_aspect_ratio), interp_type=types.INTERP_LINEAR,
                                  antialias=True)
    mirror = fn.random.coin_flip(probability=t.hflip) if t.hflip > 0 else False
    return fn.crop_mirror_normalize(clip, dtype=dtype, output_layout=t.output_layout, crop=(t.crop_size, t.crop_size),
                                    mean=list(t.mean), std=list(t.std), mirror=mirror)


def _per_clip(frames, t: ClipTransform, transform):
    """``transform`` applied to each clip of a read on its own: the read's ``clips_per_read * sequence_length``
    frames sliced into ``clips_per_read`` clips along F, each transformed with its own random draws, and
    stacked into ``(clips_per_read, clip...)`` (the clip itself when ``clips_per_read`` is 1). Each
    operator draws one set of random parameters per sample, so one crop per read would otherwise
    serve all of its clips; per-clip operators cost ``clips_per_read`` operator calls on a
    ``1 / clips_per_read`` share of the frames each, and one more copy of the read's frames."""
    from nvidia.dali import fn  # defer

    k, f = t.clips_per_read, t.sequence_length
    if k == 1:
        return transform(frames)
    clips = [transform(fn.slice(frames, start=[i * f], shape=[f], axis_names="F")) for i in range(k)]
    return fn.stack(*clips, axis=0, axis_name="N")


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
