"""ResNet-50 train and val pipelines, defined once for every framework (DALI functional API).

train: fused decode + random crop (area [0.08, 1], aspect [3/4, 4/3]) -> resize to the crop size
       with antialiasing -> [augmentation policy, ``auto_augment``: crossdali.common.augment] ->
       crop_mirror_normalize (coin-flip mirror, ImageNet mean/std).
val:   decode -> resize shorter side to crop * 256/224 -> centre crop -> normalize, with sizes
       and crop positions rounded as torchvision rounds them. No flip, no shuffle, padded last
       batch so that an iterator can drop the padding (exactly once).

``device="gpu"`` decodes with the mixed (nvJPEG / hardware JPEG) decoder and runs the rest on the
GPU; ``device="cpu"`` runs everything on the CPU with ``device_id=None`` (no GPU needed). Outputs
are ``images`` (float32/float16, CHW or HWC) and ``labels`` (int64, shape ``(1,)``).
"""

from __future__ import annotations

from dataclasses import dataclass

from crossdali.common.augment import AUTO_AUGMENT_POLICIES, apply_auto_augment, pipeline_conditionals
from crossdali.common.data.check.records import MAX_LABEL_TEXT_BYTES
from crossdali.common.data.formats import (
    TFRECORD_IMAGE_KEY,
    TFRECORD_LABEL_KEY,
    WEBDATASET_IMAGE_EXTENSIONS,
    WEBDATASET_LABEL_EXTENSION,
)
from crossdali.common.data.sources import DataSource
from crossdali.common.loading.global_order import GlobalOrderFiles
from crossdali.common.options import PipelineOptions

__all__ = [
    "READER_NAME",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "PipelineOptions",  # defined in crossdali.common.options; re-exported for the pipelines' callers
    "ClassificationTransform",
    "augment_classification",
    "decimal_text_to_int",
    "create_classification_pipeline",
]

#: Name of the reader operator; iterators pass it as ``reader_name=`` to size epochs.
READER_NAME = "Reader"
IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)

# nvJPEG scratch buffers sized for ImageNet's largest images, so the first epoch does not
# reallocate (values from DALI's RN50 example; harmless elsewhere).
_DEVICE_MEMORY_PADDING = 211_025_920
_HOST_MEMORY_PADDING = 140_544_512


@dataclass(frozen=True)
class ClassificationTransform:
    """The preset: sizes, augmentation ranges, output layout and type."""

    crop_size: int = 224
    resize_size: int | None = None  # val: shorter side before the centre crop; default crop*256/224
    random_area: tuple[float, float] = (0.08, 1.0)
    random_aspect_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    output_layout: str = "CHW"
    dtype: str = "float32"
    auto_augment: str = "none"  # train: an augmentation policy of crossdali.common.augment (none: crop and flip only)

    def __post_init__(self) -> None:
        if self.crop_size < 1:
            raise ValueError(f"crop_size must be positive, got {self.crop_size}")
        if self.auto_augment not in AUTO_AUGMENT_POLICIES:
            raise ValueError(f"auto_augment must be one of {', '.join(AUTO_AUGMENT_POLICIES)}, got {self.auto_augment!r}")
        if self.output_layout not in ("CHW", "HWC"):
            raise ValueError(f"output_layout must be 'CHW' or 'HWC', got {self.output_layout!r}")
        if self.dtype not in ("float32", "float16"):
            raise ValueError(f"dtype must be 'float32' or 'float16', got {self.dtype!r}")
        lo, hi = self.random_area
        if not 0 < lo <= hi <= 1:
            raise ValueError(f"random_area must satisfy 0 < min <= max <= 1, got {self.random_area}")

    @property
    def val_resize_size(self) -> int:
        return self.resize_size if self.resize_size is not None else round(self.crop_size * 256 / 224)


def _reader(source: DataSource, *, train: bool, opts: PipelineOptions):
    """The reader for ``source``: (encoded bytes, int64 label of shape (1,))."""
    from nvidia.dali import fn, types  # defer: keeps `import crossdali.common` light

    sharding = dict(shard_id=opts.shard_id, num_shards=opts.num_shards, name=READER_NAME,
                    pad_last_batch=opts.pad_last_batch, seed=opts.seed)
    # shuffle_after_epoch: a global reshuffle every epoch with the same seed on every shard, so
    # shards stay disjoint (random_shuffle only shuffles inside a shard's buffer). Its own seed
    # argument: without it DALI uses a fixed seed and every run has the same order.
    global_shuffle = dict(shuffle_after_epoch=True, shuffle_after_epoch_seed=opts.seed) if train else {}
    if opts.global_order is not None and train:  # one order whatever the shards (resumes on any world size)
        names, labels = fn.external_source(source=GlobalOrderFiles(
            source.files, source.labels, seed=opts.seed, rank=opts.shard_id, world=opts.num_shards,
            batch_size=opts.batch_size, order=opts.global_order), num_outputs=2, batch=True, batch_info=True)
        jpegs = fn.io.file.read(names)
    elif source.format in ("imagefolder", "filelist"):
        jpegs, labels = fn.readers.file(files=list(source.files), labels=list(source.labels), **global_shuffle,
                                        **sharding)
    elif source.format == "webdataset":
        # A shuffle buffer as for the other record formats: the reader's shuffle_after_epoch only
        # reorders whole tar files (measured: a shard's samples stayed in tar order).
        jpegs, text = fn.readers.webdataset(paths=list(source.paths), index_paths=list(source.index_paths),
                                            ext=[";".join(WEBDATASET_IMAGE_EXTENSIONS), WEBDATASET_LABEL_EXTENSION],
                                            missing_component_behavior="error", random_shuffle=train,
                                            initial_fill=opts.initial_fill, **sharding)
        labels = decimal_text_to_int(text)
    else:
        shuffle = dict(random_shuffle=train, initial_fill=opts.initial_fill)
        if source.format == "tfrecord":
            import nvidia.dali.tfrecord as tfrec

            features = {
                TFRECORD_IMAGE_KEY: tfrec.FixedLenFeature((), tfrec.string, ""),
                TFRECORD_LABEL_KEY: tfrec.FixedLenFeature([1], tfrec.int64, -1),
            }
            out = fn.readers.tfrecord(path=list(source.paths), index_path=list(source.index_paths),
                                      features=features, **shuffle, **sharding)
            jpegs, labels = out[TFRECORD_IMAGE_KEY], out[TFRECORD_LABEL_KEY]
        elif source.format == "recordio":
            jpegs, labels = fn.readers.mxnet(path=list(source.paths), index_path=list(source.index_paths),
                                             **shuffle, **sharding)
        else:
            raise ValueError(f"unknown source format {source.format!r}")
    return jpegs, fn.cast(labels, dtype=types.INT64)


def decimal_text_to_int(text, *, max_bytes: int = MAX_LABEL_TEXT_BYTES):
    """The integer written as decimal text in ``text`` (uint8 bytes, e.g. WebDataset's ``.cls``
    ``b"12\\n"``), as int64 of shape (1,). Equal to ``int(text)`` for every text that ``crossdali
    check`` accepts: 1 to 12 (``check.records.MAX_LABEL_DIGITS``) ASCII digits with optional whitespace around them
    (``b"7"``, ``b"0042\\r\\n"``, ``b" 345 "``), at most ``max_bytes`` bytes in all. Anything else
    gives some number without an error (no digit: 0). Written by hand: DALI has no string-to-number
    operator, and parsing after the iterator would put the same code in every framework's wrapper.

    Vectorised over the first ``max_bytes`` bytes (spaces past the end): each digit's value by a
    lookup table, times 10 to the power of its distance from the last digit (that distance is the
    number of digits after it, as the checker allows no gap between digits), summed: about 12 CPU
    operators a sample, where a Horner loop over the characters runs about 120 and costs more than
    reading the tar itself (``python -m benchmarks.loader_formats`` compares WebDataset shards with
    the same JPEGs as files: docs/benchmarks.md#loader-formats)."""
    import numpy as np
    import nvidia.dali.math as dmath
    from nvidia.dali import fn, types

    chars = fn.slice(text, 0, max_bytes, axes=[0], out_of_bounds_policy="pad", fill_values=32)  # space-padded
    keys = list(range(ord("0"), ord("9") + 1))
    is_digit = fn.lookup_table(chars, keys=keys, values=[1.0] * 10, dtype=types.INT64)  # other bytes: 0
    digit = fn.lookup_table(chars, keys=keys, values=[float(d) for d in range(10)], dtype=types.INT64)
    position = types.Constant(np.arange(max_bytes, dtype=np.int64))
    last = fn.reductions.max(position * is_digit)  # position of the last digit
    # 10 ** (last - position): exact in int64 (not a float lookup table: float32 holds 10**11 inexactly);
    # past the last digit the exponent is negative, the power 0 and the digit 0 anyway.
    weight = dmath.pow(types.Constant(10, dtype=types.INT64), last - position)
    return fn.reshape(fn.reductions.sum(digit * weight), shape=[1])


def _val_geometry(jpegs, *, resize: int, crop: int):
    """Resize sizes and centre-crop positions computed exactly as torchvision computes them.

    DALI's ``resize_shorter`` rounds the longer side and its centre crop rounds the anchor half
    up; torchvision's ``Resize(int)`` truncates the longer side and ``CenterCrop`` rounds the
    anchor half to even. Matching them here makes DALI's val images agree with torchvision's to
    a fraction of a grey level (tests/pytorch/test_native_parity.py), so accuracy measured on
    either is comparable. Integer arithmetic on the encoded image's shape, on the CPU.
    """
    import nvidia.dali.math as dmath
    from nvidia.dali import fn, types

    shape = fn.peek_image_shape(jpegs)
    h, w = shape[0], shape[1]
    longer = (resize * dmath.max(h, w)) // dmath.min(h, w)
    h_is_short = h <= w
    out_h = h_is_short * resize + (1 - h_is_short) * longer
    out_w = (1 - h_is_short) * resize + h_is_short * longer

    def centre(n):  # torchvision: int(round((n - crop) / 2)), Python's half-to-even round
        d = n - crop
        half = d // 2
        anchor = half + (d % 2) * (half % 2)
        return fn.cast(anchor, dtype=types.FLOAT) / fn.cast(dmath.max(d, 1), dtype=types.FLOAT)

    as_float = dict(dtype=types.FLOAT)
    return fn.cast(out_h, **as_float), fn.cast(out_w, **as_float), centre(out_h), centre(out_w)


def augment_classification(jpegs, *, train: bool, options: PipelineOptions,
                           transform: ClassificationTransform | None = None):
    """The train or val transform of ``jpegs`` (encoded images, a CPU ``DataNode``): images ready for the model.

    The one definition of crossdali's classification preprocessing, called inside a ``pipeline_def``
    by every pipeline that decodes images (the readers' pipeline below, the external-source
    pipeline, the inference pipeline), so they cannot drift apart. ``options`` gives the device
    (``gpu``: mixed decoder, hardware JPEG share ``hw_decoder_load``). A ``transform.auto_augment``
    policy (train only) needs a pipeline defined with
    ``crossdali.common.augment.pipeline_conditionals(transform.auto_augment)``.
    """
    from nvidia.dali import fn, types  # defer: keeps `import crossdali.common` light

    t = transform or ClassificationTransform()
    gpu = options.device == "gpu"
    decoder_device = "mixed" if gpu else "cpu"
    decoder_args = (
        dict(hw_decoder_load=options.hw_decoder_load, device_memory_padding=_DEVICE_MEMORY_PADDING,
             host_memory_padding=_HOST_MEMORY_PADDING, preallocate_width_hint=5980 if train else 0,
             preallocate_height_hint=6430 if train else 0)
        if gpu else {}
    )
    dtype = types.FLOAT16 if t.dtype == "float16" else types.FLOAT
    if train:
        images = fn.decoders.image_random_crop(
            jpegs, device=decoder_device, output_type=types.RGB,
            random_area=list(t.random_area), random_aspect_ratio=list(t.random_aspect_ratio),
            num_attempts=100, **decoder_args)
        images = fn.resize(images, resize_x=t.crop_size, resize_y=t.crop_size,
                           interp_type=types.INTERP_LINEAR, antialias=True)
        images = apply_auto_augment(images, t.auto_augment, crop_size=t.crop_size)  # none: no operator
        mirror, crop_pos = fn.random.coin_flip(probability=0.5), {}
    else:
        out_h, out_w, crop_y, crop_x = _val_geometry(jpegs, resize=t.val_resize_size, crop=t.crop_size)
        images = fn.decoders.image(jpegs, device=decoder_device, output_type=types.RGB, **decoder_args)
        images = fn.resize(images, resize_x=out_w, resize_y=out_h,
                           interp_type=types.INTERP_LINEAR, antialias=True)
        mirror, crop_pos = False, dict(crop_pos_x=crop_x, crop_pos_y=crop_y)
    return fn.crop_mirror_normalize(
        images, dtype=dtype, output_layout=t.output_layout, crop=(t.crop_size, t.crop_size),
        mean=list(t.mean), std=list(t.std), mirror=mirror, **crop_pos)


def create_classification_pipeline(
    source: DataSource,
    *,
    train: bool,
    options: PipelineOptions,
    transform: ClassificationTransform | None = None,
):
    """Build (but do not start) the ResNet-50 train or val pipeline over ``source``.

    Args:
        source: a resolved split (``crossdali.common.data.sources.resolve_source``): files and labels,
            or TFRecord / RecordIO / WebDataset records with their indexes.
        train: random-resized crop, flip and normalize, shuffled; or resize, centre crop and
            normalize, every sample once across shards.
        options: where and how the pipeline runs (device, threads, shard, seed, batch size).
        transform: the preset's sizes, augmentation ranges and policy, layout and type (default:
            ``ClassificationTransform()``).

    Returns:
        A ``nvidia.dali.Pipeline`` with outputs ``(images, labels)``, its reader named
        ``READER_NAME``; call ``.build()`` or hand it to a framework iterator.
    """
    from nvidia.dali import pipeline_def  # defer: keeps `import crossdali.common` light

    opts = options
    policy = transform.auto_augment if transform is not None and train else "none"

    @pipeline_def(**opts.pipeline_kwargs(), **pipeline_conditionals(policy))
    def classification_pipeline():
        jpegs, labels = _reader(source, train=train, opts=opts)
        images = augment_classification(jpegs, train=train, options=opts, transform=transform)
        if opts.device == "gpu":
            labels = labels.gpu()
        return images, labels

    return classification_pipeline()
