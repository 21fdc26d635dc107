"""The on-disk formats crossdali reads: their names, and the keys and extensions inside them.

Shared by the sources that find a dataset, the checks that read its bytes and the sample-data
builders that write it, so that all three agree on one convention.
"""

from __future__ import annotations

__all__ = [
    "FORMATS",
    "IMAGE_EXTENSIONS",
    "TFRECORD_IMAGE_KEY",
    "TFRECORD_LABEL_KEY",
    "WEBDATASET_IMAGE_EXTENSIONS",
    "WEBDATASET_LABEL_EXTENSION",
]

#: The classification dataset layouts ``resolve_source`` accepts as ``format``.
FORMATS = ("imagefolder", "filelist", "tfrecord", "recordio", "webdataset")

#: Extensions ``fn.readers.file`` and the decoders accept (case-insensitive).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".pnm", ".ppm", ".pgm", ".pbm", ".jp2", ".webp")

#: The components of a WebDataset sample the classification pipelines read: the image (the first of
#: these extensions the sample has) and the label as decimal text (``.cls``, WebDataset's convention).
WEBDATASET_IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff")
WEBDATASET_LABEL_EXTENSION = "cls"

#: TFRecord features crossdali reads (and its sample set writes): ImageNet's TFRecord convention.
TFRECORD_IMAGE_KEY = "image/encoded"
TFRECORD_LABEL_KEY = "image/class/label"
