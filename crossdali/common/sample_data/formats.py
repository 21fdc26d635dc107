"""Writers for the record formats DALI reads: TFRecord (+ DALI index) and MXNet RecordIO (+ .idx).

TFRecord goes through the maintained ``tfrecord`` package (no TensorFlow needed). MXNet RecordIO
is written by hand: the only maintained writer is ``mxnet.recordio`` itself, and the PyTorch and
TensorFlow environments must not need MXNet. The MXNet test suite reads these files back with
``mxnet.recordio`` to prove the format.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "TFRECORD_IMAGE_KEY",
    "TFRECORD_LABEL_KEY",
    "write_tfrecord",
    "write_recordio",
]

TFRECORD_IMAGE_KEY = "image/encoded"
TFRECORD_LABEL_KEY = "image/class/label"

# dmlc-core's RecordIO: every record is <magic><flag:3 bits | length:29 bits><payload><pad to 4>;
# an image record's payload starts with mxnet's IRHeader (flag, label, id, id2).
_RECORDIO_MAGIC = 0xCED7230A
_IRHEADER = struct.Struct("<IfQQ")


def write_tfrecord(path: Path, samples: Iterable[tuple[bytes, int]]) -> Path:
    """Write ``(jpeg_bytes, label)`` samples to ``path`` and its DALI index to ``path.idx``.

    Returns the index path. The index lists "offset length" per record, the format of DALI's
    ``tfrecord2idx`` tool, which ``fn.readers.tfrecord`` requires.
    """
    from tfrecord import TFRecordWriter  # defer: only the builder needs it
    from tfrecord.tools.tfrecord2idx import create_index

    writer = TFRecordWriter(str(path))
    try:
        for jpeg, label in samples:
            writer.write({TFRECORD_IMAGE_KEY: (jpeg, "byte"), TFRECORD_LABEL_KEY: (int(label), "int")})
    finally:
        writer.close()
    index = path.with_suffix(".idx")
    create_index(str(path), str(index))
    return index


def write_recordio(path: Path, samples: Iterable[tuple[bytes, int]]) -> Path:
    """Write ``(jpeg_bytes, label)`` samples as MXNet RecordIO at ``path`` plus ``path.idx``.

    Same layout as ``im2rec.py`` output: record ``i`` has id ``i`` and the label as a float.
    """
    index = path.with_suffix(".idx")
    with open(path, "wb") as rec, open(index, "w", encoding="ascii") as idx:
        for i, (jpeg, label) in enumerate(samples):
            payload = _IRHEADER.pack(0, float(label), i, 0) + jpeg
            if len(payload) >= 1 << 29:
                raise ValueError(f"record {i} is {len(payload)} bytes, over RecordIO's 512 MiB limit")
            idx.write(f"{i}\t{rec.tell()}\n")
            rec.write(struct.pack("<II", _RECORDIO_MAGIC, len(payload)))
            rec.write(payload)
            rec.write(b"\0" * (-len(payload) % 4))
    return index
