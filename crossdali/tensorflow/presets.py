"""The ``native`` baseline's preprocessing in TensorFlow ops: the classification preset
(``crossdali.common.classification.ClassificationTransform``) as a TensorFlow user writes it today.

val matches DALI's CPU pipeline to a fraction of a grey level (docs/tensorflow.md); train draws the
same distributions with TensorFlow's random numbers.
"""

from __future__ import annotations

import tensorflow as tf

from crossdali.common.classification import ClassificationTransform

__all__ = ["train_image", "val_image", "normalize", "parse_tfrecord"]

# libjpeg's accurate integer IDCT: what DALI's CPU decoder (libjpeg-turbo) and Pillow use. TF's
# default (fast IDCT) differs from them by about 1 level on average, up to 11 (measured).
_DCT = "INTEGER_ACCURATE"


def _is_jpeg(data: tf.Tensor) -> tf.Tensor:
    """Whether the encoded bytes are a JPEG (its SOI marker), whatever the file is named: the other
    loaders (DALI, torchvision, Pillow) sniff the bytes too."""
    return tf.equal(tf.strings.substr(data, 0, 2), b"\xff\xd8")


def _decode_other(data: tf.Tensor) -> tf.Tensor:
    """A non-JPEG image (PNG, BMP, WebP, GIF's first frame) as ``uint8`` RGB, shape ``[H, W, 3]``
    (a 16-bit PNG reduced to 8 bits)."""
    img = tf.io.decode_image(data, channels=3, dtype=tf.uint8, expand_animations=False)
    img.set_shape([None, None, 3])
    return img


def train_image(jpeg: tf.Tensor, t: ClassificationTransform) -> tf.Tensor:
    """Random-resized crop, antialiased bilinear resize, coin-flip mirror. A JPEG's crop window is
    read from its header and decoded alone (``decode_and_crop_jpeg``, fused like DALI's
    ``image_random_crop``); any other format (PNG, BMP, WebP, GIF) is decoded whole, then cropped."""

    def window(shape: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            shape, bounding_boxes=tf.zeros([1, 0, 4]), min_object_covered=0.0,
            aspect_ratio_range=t.random_aspect_ratio, area_range=t.random_area, max_attempts=100,
            use_image_if_no_bounding_boxes=True)
        return begin, size

    def jpeg_crop() -> tf.Tensor:
        begin, size = window(tf.image.extract_jpeg_shape(jpeg))
        crop = tf.stack([begin[0], begin[1], size[0], size[1]])
        return tf.image.decode_and_crop_jpeg(jpeg, crop, channels=3, dct_method=_DCT)

    def other_crop() -> tf.Tensor:
        img = _decode_other(jpeg)
        begin, size = window(tf.shape(img))
        return tf.slice(img, begin, size)

    img = tf.cond(_is_jpeg(jpeg), jpeg_crop, other_crop)
    img = tf.image.resize(img, [t.crop_size, t.crop_size], method="bilinear", antialias=True)
    return tf.image.random_flip_left_right(img)


def val_image(jpeg: tf.Tensor, t: ClassificationTransform) -> tf.Tensor:
    """Shorter side to ``val_resize_size`` (antialiased bilinear), centre crop: DALI's val ops with
    the same geometry (longer side truncated, crop anchor rounded half to even, as torchvision and
    ``crossdali.common.classification`` do)."""
    img = tf.cond(_is_jpeg(jpeg), lambda: tf.io.decode_jpeg(jpeg, channels=3, dct_method=_DCT),
                  lambda: _decode_other(jpeg))
    h, w = tf.shape(img)[0], tf.shape(img)[1]
    short, resize = tf.minimum(h, w), t.val_resize_size
    longer = resize * tf.maximum(h, w) // short
    out = tf.where(h <= w, tf.stack([resize, longer]), tf.stack([longer, resize]))
    img = tf.image.resize(img, out, method="bilinear", antialias=True)
    img = tf.clip_by_value(tf.floor(img + 0.5), 0, 255)  # DALI's resize outputs uint8, rounded half up
    c = t.crop_size
    top = tf.cast(tf.round(tf.cast(out[0] - c, tf.float32) / 2), tf.int32)  # tf.round: half to even
    left = tf.cast(tf.round(tf.cast(out[1] - c, tf.float32) / 2), tf.int32)
    return img[top : top + c, left : left + c]


def normalize(img: tf.Tensor, t: ClassificationTransform) -> tf.Tensor:
    """Mean/std normalisation, then the transform's dtype and layout (HWC or CHW)."""
    img = (tf.cast(img, tf.float32) - tf.constant(t.mean, tf.float32)) / tf.constant(t.std, tf.float32)
    img = tf.cast(img, tf.float16 if t.dtype == "float16" else tf.float32)
    return tf.transpose(img, [2, 0, 1]) if t.output_layout == "CHW" else img


def parse_tfrecord(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """(encoded JPEG, int64 label) of one record written by crossdali's sample builder / re-encoder."""
    from crossdali.common.data.formats import TFRECORD_IMAGE_KEY, TFRECORD_LABEL_KEY

    ex = tf.io.parse_single_example(record, {
        TFRECORD_IMAGE_KEY: tf.io.FixedLenFeature([], tf.string),
        TFRECORD_LABEL_KEY: tf.io.FixedLenFeature([1], tf.int64, default_value=[-1]),
    })
    return ex[TFRECORD_IMAGE_KEY], ex[TFRECORD_LABEL_KEY][0]
