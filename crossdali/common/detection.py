"""SSD300 train and val pipelines over COCO-format data, defined once for every framework.

train: readers.coco (ltrb boxes relative to the image, empty images skipped, global reshuffle
       every epoch, sharded by the global rank)
       -> zoom-out: ``paste`` on a canvas ``ratio`` times larger (ratio 1 with probability
          1 - zoom_out_probability, else uniform in [1, max_ratio]; random position; fill = the
          mean colour) and ``bbox_paste`` with the same ratio and position
       -> ``random_bbox_crop`` (IoU thresholds 0/0.1/0.3/0.5/0.7/0.9, scale [0.3, 1], aspect
          [0.5, 2], or no crop) applied to the pasted image with ``slice``; boxes whose centre
          leaves the window are dropped, the others clipped to it
       -> resize to 300x300 -> colour jitter (``hsv``: hue, saturation; ``brightness_contrast``)
       -> ``crop_mirror_normalize`` whose mirror is the very coin that drove ``bb_flip``
       -> ``box_encoder`` against SSD300's 8,732 default boxes (``crossdali.common.anchors``):
          per anchor a (dx, dy, dw, dh) regression target and a label (0 = background).
val:   decode -> resize 300x300 -> normalize; boxes (ltrb, relative) and labels padded to the
       longest in the batch (label 0 = padding), and the COCO image id for evaluation.

By default (``DetectionTransform.canvas_free``) the zoom-out, crop and resize run without building the canvas,
the same geometry as paste -> slice -> resize: on the CPU only the window's part of the image is decoded,
resized to its place in the output and padded with the fill colour; on the GPU the whole image is decoded (the
hardware decoder cannot decode a region) and the window read with one padded slice before the resize. The
canvas holds up to 16 times the image, so both are faster than building it (docs/benchmarks.md#detection-loaders);
``canvas_free=False`` builds it.
``device="gpu"`` decodes with the mixed decoder and crops, resizes and encodes on the GPU
(box geometry, which is tiny, stays on the CPU); ``device="cpu"`` needs no GPU. Labels are DALI's
contiguous class indices 1..C: categories in the annotation file's order (``DetectionSource.label_to_category``).
``debug=True`` adds the random parameters and intermediate boxes (``DEBUG_OUTPUTS``) so tests can
recompute the geometry independently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from crossdali.common.anchors import BOX_CODER_STDS, ssd300_default_boxes
from crossdali.common.classification import IMAGENET_MEAN, IMAGENET_STD
from crossdali.common.data.coco import DetectionSource, coco_problems, resolve_detection_source
from crossdali.common.data.sources import explain_files_failure
from crossdali.common.options import PipelineOptions

__all__ = [
    "READER_NAME",
    "TRAIN_OUTPUTS",
    "VAL_OUTPUTS",
    "DEBUG_OUTPUTS",
    "DetectionSource",  # this and the next two: the COCO data helpers of crossdali.common.data.coco
    "coco_problems",
    "resolve_detection_source",
    "DetectionTransform",
    "create_detection_pipeline",
    "DETECTION_GPU_PIPELINES",
    "default_detection_pipelines",
    "explain_detection_failure",
]

#: Name of the reader operator; iterators pass it as ``reader_name=`` to size epochs.
READER_NAME = "Reader"
TRAIN_OUTPUTS = ("images", "boxes", "labels")
VAL_OUTPUTS = ("images", "boxes", "labels", "image_ids")
#: Extra train outputs with ``debug=True`` (boxes/labels padded with 0 to the batch's longest).
DEBUG_OUTPUTS = ("raw_boxes", "raw_labels", "ratio", "paste_x", "paste_y", "crop_anchor", "crop_shape", "flip",
                 "crop_boxes", "crop_labels")

#: DALI pipelines the detection loaders start per process for training on the GPU (``pipelines=None``): two keep
#: the hardware JPEG decoder and the SMs busier than one (docs/benchmarks.md#detection-loaders); val keeps one.
DETECTION_GPU_PIPELINES = 2


def default_detection_pipelines(backend: str, batch_size: int, *, train: bool) -> int:
    """``pipelines=None`` of the detection loaders: ``DETECTION_GPU_PIPELINES`` for training on ``dali-gpu`` where
    the batch splits evenly, else 1."""
    gpu_train = train and backend == "dali-gpu" and batch_size % DETECTION_GPU_PIPELINES == 0
    return DETECTION_GPU_PIPELINES if gpu_train else 1


@dataclass(frozen=True)
class DetectionTransform:
    """SSD300's augmentation ranges (those of the SSD paper and torchvision's detection reference)."""

    size: int = 300
    zoom_out_probability: float = 0.5
    max_zoom_out: float = 4.0
    iou_thresholds: tuple[float, ...] = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9)
    crop_scaling: tuple[float, float] = (0.3, 1.0)
    crop_aspect_ratio: tuple[float, float] = (0.5, 2.0)
    hue_degrees: float = 18.0  # torchvision ColorJitter(hue=0.05) = 0.05 * 360 degrees
    saturation: tuple[float, float] = (0.5, 1.5)
    brightness: tuple[float, float] = (0.875, 1.125)
    contrast: tuple[float, float] = (0.5, 1.5)
    flip_probability: float = 0.5
    match_iou: float = 0.5
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    #: train: colour jitter + normalisation as one operator of crossdali's DALI plugin (built with
    #: ``python -m crossdali.common.plugins build``; docs/custom-operators.md), the same pixels in one pass
    fused_colour: bool = False
    #: train: zoom-out, crop and resize without the zoomed-out canvas (CPU: only the window's part of the
    #: image is decoded, resized and padded with the fill colour, ``_zoom_out_crop_resize``; GPU: one padded
    #: slice of the window, ``_padded_crop_resize``); False: paste on the canvas (up to 16x the image), slice, resize
    canvas_free: bool = True

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"size must be positive, got {self.size}")
        if self.max_zoom_out < 1:
            raise ValueError(f"max_zoom_out must be >= 1, got {self.max_zoom_out}")
        for name in ("zoom_out_probability", "flip_probability", "match_iou"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")

    @property
    def fill(self) -> list[int]:
        return [round(m) for m in self.mean]


def explain_detection_failure(source: DetectionSource, error: Exception) -> Exception:
    """DALI's anonymous decoder failure as a ``DataError`` naming the image file (the COCO reader's
    files are those the annotation file lists)."""
    coco = json.loads(source.annotations_file.read_text(encoding="utf-8"))
    files = [str(source.file_root / im["file_name"]) for im in coco["images"]]
    return explain_files_failure(error, files=files, where=str(source.annotations_file))


def _padded(x, fill):
    """Pad a per-sample list (boxes (n, 4), labels (n,)) to the longest in the batch."""
    from nvidia.dali import fn

    return fn.pad(x, fill_value=fill, axes=(0,))


def _zoom_out_crop_resize(jpegs, ratio, paste_x, paste_y, anchor, shape, *, size: int, fill: list[int], decoder: dict):
    """The zoom-out paste, the crop and the resize to ``size`` x ``size`` without the zoomed-out canvas.

    The crop window (``anchor``, ``shape``: relative to a canvas ``ratio`` times the image, the
    image pasted at ``paste_x``, ``paste_y``) is mapped into the image's own coordinates; only the
    part of the image inside the window is decoded (``decoders.image_slice``), resized to the size
    it takes in the output, and placed there on a ``fill`` background (``slice`` with padding).
    The pixels are those of paste -> slice -> resize up to the rounding of the image's edge to
    whole output pixels; the canvas (up to 16 times the image's pixels) is never built. The CPU's
    spelling: on the GPU ``_padded_crop_resize`` (the hardware JPEG decoder does not decode a region,
    so ``image_slice`` would move every image to the CUDA decoder).
    """
    from nvidia.dali import fn, math, types

    eps = 1e-4  # a window that misses the image still decodes a sliver of it, then moves it out of view
    a = anchor * ratio - fn.stack(paste_x, paste_y) * (ratio - 1.0)  # the window in the image, (x, y), relative
    s = shape * ratio
    lo = math.clamp(a, 0.0, 1.0 - eps)
    hi = math.clamp(a + s, lo + eps, 1.0)
    start = math.floor(size * (lo - a) / s + 0.5)  # where the visible part lands in the output, pixels
    extent = math.max(math.floor(size * (hi - a) / s + 0.5) - start, 1.0)
    miss = fn.cast((a + s <= 0.0) | (a >= 1.0), dtype=types.FLOAT)
    miss = math.max(miss[0], miss[1])
    images = fn.decoders.image_slice(jpegs, lo, hi - lo, axis_names="WH", **decoder)
    images = fn.resize(images, resize_x=extent[0], resize_y=extent[1], min_filter=types.INTERP_TRIANGULAR)
    out_anchor = -start * (1.0 - miss) + 2.0 * size * miss
    return fn.slice(images, out_anchor, fn.constant(fdata=[float(size), float(size)]), axis_names="WH",
                    normalized_anchor=False, normalized_shape=False, out_of_bounds_policy="pad", fill_values=fill)


def _padded_crop_resize(images, ratio, paste_x, paste_y, anchor, shape, *, size: int, fill: list[int]):
    """The zoom-out paste, the crop and the resize of decoded ``images`` without the zoomed-out canvas, on the GPU.

    The crop window (``anchor``, ``shape``: relative to a canvas ``ratio`` times the image, the image
    pasted at ``paste_x``, ``paste_y``) is mapped into the image's own coordinates and read with one
    ``slice`` that pads with ``fill`` where the window leaves the image, then resized: the pixels of paste ->
    slice -> resize up to the rounding of the window's corner to whole pixels, with the crop written once
    instead of the whole canvas (up to 16 times the image's pixels) and then the crop.
    """
    from nvidia.dali import fn, types

    a = anchor * ratio - fn.stack(paste_x, paste_y) * (ratio - 1.0)  # the window in the image, (x, y), relative
    images = fn.slice(images, a, shape * ratio, axis_names="WH", out_of_bounds_policy="pad", fill_values=fill)
    return fn.resize(images, resize_x=size, resize_y=size, min_filter=types.INTERP_TRIANGULAR)


def create_detection_pipeline(source: DetectionSource, *, train: bool, options: PipelineOptions,
                              transform: DetectionTransform | None = None, debug: bool = False):
    """Build (but do not start) the SSD300 train or val pipeline over ``source`` (the module
    docstring lists its steps).

    Args:
        source: a resolved COCO-format split (``resolve_detection_source``).
        train: the SSD augmentation and encoded boxes, shuffled; or resize and raw boxes with image ids.
        options: where and how the pipeline runs (device, threads, shard, seed, batch size).
        transform: the augmentation ranges (default: SSD300's, ``DetectionTransform()``).
        debug: train only: add ``DEBUG_OUTPUTS``, the random parameters and intermediate boxes.

    Returns:
        A ``nvidia.dali.Pipeline`` whose outputs are ``TRAIN_OUTPUTS`` or ``VAL_OUTPUTS`` (then
        ``DEBUG_OUTPUTS``), its reader named ``READER_NAME``.
    """
    from nvidia.dali import fn, pipeline_def, types  # defer: keeps `import crossdali.common` light

    t = transform or DetectionTransform()
    opts = options
    gpu = opts.device == "gpu"
    anchors = ssd300_default_boxes().ltrb().reshape(-1).tolist() if t.size == 300 else None
    if anchors is None:
        raise ValueError(f"SSD300's default boxes are defined for size 300, got {t.size}")

    @pipeline_def(**opts.pipeline_kwargs())
    def detection_pipeline():
        outs = fn.readers.coco(
            file_root=str(source.file_root), annotations_file=str(source.annotations_file), ltrb=True, ratio=True,
            skip_empty=source.skip_empty, include_iscrowd=False, image_ids=not train,
            # a global reshuffle every epoch, seeded (DALI's default seed is fixed: one order for every run)
            **(dict(shuffle_after_epoch=True, shuffle_after_epoch_seed=opts.seed) if train else {}),
            shard_id=opts.shard_id, num_shards=opts.num_shards, pad_last_batch=True, seed=opts.seed,
            name=READER_NAME)
        jpegs, boxes, labels = outs[0], outs[1], outs[2]
        decoder = dict(device="mixed" if gpu else "cpu", output_type=types.RGB)
        if gpu:
            decoder["hw_decoder_load"] = opts.hw_decoder_load
        canvas_free = train and t.canvas_free
        images = None if canvas_free and not gpu else fn.decoders.image(jpegs, **decoder)
        if not train:
            images = fn.resize(images, resize_x=t.size, resize_y=t.size, min_filter=types.INTERP_TRIANGULAR)
            images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                              mean=list(t.mean), std=list(t.std))
            image_ids = fn.cast(outs[3], dtype=types.INT64)
            return images, _padded(boxes, 0.0), fn.cast(_padded(labels, 0), dtype=types.INT64), image_ids
        raw_boxes, raw_labels = boxes, labels
        # zoom-out: the same ratio and position drive the image paste and the box paste
        zoom = fn.random.coin_flip(probability=t.zoom_out_probability)
        ratio = 1.0 + fn.cast(zoom, dtype=types.FLOAT) * (fn.random.uniform(range=[1.0, t.max_zoom_out]) - 1.0)
        paste_x = fn.random.uniform(range=[0.0, 1.0])
        paste_y = fn.random.uniform(range=[0.0, 1.0])
        if not canvas_free:
            images = fn.paste(images, ratio=ratio, paste_x=paste_x, paste_y=paste_y, fill_value=t.fill)
        boxes = fn.bbox_paste(boxes, ratio=ratio, paste_x=paste_x, paste_y=paste_y, ltrb=True)
        # prospective IoU crop: boxes whose centre leaves the window are dropped, others clipped
        anchor, shape, boxes, labels = fn.random_bbox_crop(
            boxes, labels, thresholds=list(t.iou_thresholds), scaling=list(t.crop_scaling),
            aspect_ratio=list(t.crop_aspect_ratio), bbox_layout="xyXY", allow_no_crop=True, num_attempts=50)
        if canvas_free and gpu:
            images = _padded_crop_resize(images, ratio, paste_x, paste_y, anchor, shape, size=t.size, fill=t.fill)
        elif canvas_free:
            images = _zoom_out_crop_resize(jpegs, ratio, paste_x, paste_y, anchor, shape, size=t.size, fill=t.fill,
                                           decoder=decoder)
        else:
            images = fn.slice(images, anchor, shape, axis_names="WH", normalized_anchor=True, normalized_shape=True,
                              out_of_bounds_policy="trim_to_shape")
            images = fn.resize(images, resize_x=t.size, resize_y=t.size, min_filter=types.INTERP_TRIANGULAR)
        flip = fn.random.coin_flip(probability=t.flip_probability)
        boxes = fn.bb_flip(boxes, ltrb=True, horizontal=flip)
        crop_boxes, crop_labels = boxes, labels
        if t.fused_colour:  # the three operators below in one (crossdali.common.plugins)
            from crossdali.common.plugins import color_jitter_normalize

            images = color_jitter_normalize(
                images, hue=fn.random.uniform(range=[-t.hue_degrees, t.hue_degrees]),
                saturation=fn.random.uniform(range=list(t.saturation)),
                brightness=fn.random.uniform(range=list(t.brightness)),
                contrast=fn.random.uniform(range=list(t.contrast)), mirror=flip, mean=t.mean, std=t.std)
        else:
            images = fn.hsv(images, hue=fn.random.uniform(range=[-t.hue_degrees, t.hue_degrees]),
                            saturation=fn.random.uniform(range=list(t.saturation)))
            images = fn.brightness_contrast(images, brightness=fn.random.uniform(range=list(t.brightness)),
                                            contrast=fn.random.uniform(range=list(t.contrast)))
            images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW", mean=list(t.mean),
                                              std=list(t.std), mirror=flip)
        if gpu:
            boxes, labels = boxes.gpu(), labels.gpu()
        boxes, labels = fn.box_encoder(boxes, labels, criteria=t.match_iou, anchors=anchors, offset=True,
                                       stds=list(BOX_CODER_STDS), scale=1.0)
        outputs = (images, boxes, fn.cast(labels, dtype=types.INT64))
        if debug:
            extra = (_padded(raw_boxes, 0.0), _padded(raw_labels, 0), ratio, paste_x, paste_y, anchor, shape,
                     flip, _padded(crop_boxes, 0.0), _padded(crop_labels, 0))
            # a GPU pipeline hands CPU outputs over in pinned memory, which torch.from_dlpack rejects
            # ("Unsupported device_type: 3"): every output of a GPU pipeline lives on the GPU
            outputs += tuple(x.gpu() for x in extra) if gpu else extra
        return outputs

    return detection_pipeline()

