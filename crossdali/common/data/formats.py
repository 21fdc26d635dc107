"""The on-disk formats crossdali reads: their names, and the keys and extensions inside them.

Shared by the sources that find a dataset, the checks that read its bytes and the sample-data
builders that write it, so that all three agree on one convention.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DataSource",
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


@dataclass(frozen=True)
class DataSource:
    """One split of a dataset, ready for a reader (found by ``crossdali.common.data.sources.resolve_source``,
    on a local disk or in an object store).

    ``files``/``labels`` are set for ``imagefolder`` and ``filelist``; ``paths``/``index_paths``
    for ``tfrecord``, ``recordio`` and ``webdataset``. ``classes`` is known for ImageFolders only.
    """

    format: str
    root: Path
    files: tuple[str, ...] = ()
    labels: tuple[int, ...] = ()
    paths: tuple[str, ...] = ()
    index_paths: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()
    num_samples: int = 0

    @property
    def num_classes(self) -> int:
        return len(self.classes) if self.classes else (max(self.labels) + 1 if self.labels else 0)
