"""Writers for the record formats DALI reads: TFRecord (+ DALI index), MXNet RecordIO (+ .idx) and
WebDataset tar shards (+ DALI's ``wds2idx`` index).

TFRecord goes through the maintained ``tfrecord`` package where TensorFlow is not installed, and
through TensorFlow's own writer where it is: both packages register ``tensorflow.Example`` in
protobuf's default pool, so importing ``tfrecord`` next to TensorFlow fails ("duplicate symbol
'tensorflow.BytesList'") and would break TensorFlow for the rest of the process. MXNet RecordIO
is written by hand: the only maintained writer is ``mxnet.recordio`` itself, and the PyTorch and
TensorFlow environments must not need MXNet. The MXNet test suite reads these files back with
``mxnet.recordio`` to prove the format.
"""

from __future__ import annotations

import importlib.util
import io
import struct
import tarfile
from collections.abc import Iterable
from pathlib import Path

from crossdali.common.data.formats import TFRECORD_IMAGE_KEY, TFRECORD_LABEL_KEY  # the format the pipelines read

__all__ = [
    "write_tfrecord",
    "write_recordio",
    "write_webdataset",
]


# dmlc-core's RecordIO: every record is <magic><flag:3 bits | length:29 bits><payload><pad to 4>;
# an image record's payload starts with mxnet's IRHeader (flag, label, id, id2).
_RECORDIO_MAGIC = 0xCED7230A
_IRHEADER = struct.Struct("<IfQQ")


def write_tfrecord(path: Path, samples: Iterable[tuple[bytes, int]]) -> Path:
    """Write ``(jpeg_bytes, label)`` samples to ``path`` and its DALI index to ``path.idx``.

    Returns the index path. The index lists "offset length" per record, the format of DALI's
    ``tfrecord2idx`` tool, which ``fn.readers.tfrecord`` requires. Every record is framed as
    length (8 bytes) + length CRC (4) + payload + payload CRC (4), so the index follows from the
    payload lengths.
    """
    write = _tensorflow_writer if _tensorflow_installed() else _tfrecord_package_writer
    lengths = write(path, samples)
    index = path.with_suffix(".idx")
    offset, lines = 0, []
    for n in lengths:
        lines.append(f"{offset} {n + 16}\n")
        offset += n + 16
    if offset != path.stat().st_size:  # the framing above is the TFRecord spec; never write a wrong index
        raise RuntimeError(f"{path}: {path.stat().st_size} bytes on disk, index adds up to {offset}")
    index.write_text("".join(lines), encoding="ascii")
    return index


def _tensorflow_installed() -> bool:
    spec = importlib.util.find_spec("tensorflow")
    return spec is not None and spec.origin is not None  # a real package, not a folder named tensorflow


def _tfrecord_package_writer(path: Path, samples: Iterable[tuple[bytes, int]]) -> list[int]:
    from tfrecord import TFRecordWriter  # defer: only the builder needs it

    writer, lengths = TFRecordWriter(str(path)), []
    try:
        for jpeg, label in samples:
            start = writer.file.tell()
            writer.write({TFRECORD_IMAGE_KEY: (jpeg, "byte"), TFRECORD_LABEL_KEY: (int(label), "int")})
            lengths.append(writer.file.tell() - start - 16)
    finally:
        writer.close()
    return lengths


def _tensorflow_writer(path: Path, samples: Iterable[tuple[bytes, int]]) -> list[int]:
    import tensorflow as tf

    lengths = []
    with tf.io.TFRecordWriter(str(path)) as writer:
        for jpeg, label in samples:
            feature = {TFRECORD_IMAGE_KEY: tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
                       TFRECORD_LABEL_KEY: tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)]))}
            record = tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
            writer.write(record)
            lengths.append(len(record))
    return lengths


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


def write_webdataset(folder: Path, split: str, samples: Iterable[tuple[bytes, int]], *,
                     shard_size: int = 256) -> list[Path]:
    """Write ``(jpeg_bytes, label)`` samples as WebDataset shards ``folder/<split>-000000.tar`` ...
    (``shard_size`` samples each: ``<nnnnnn>.jpg`` + ``<nnnnnn>.cls``, the label as decimal text,
    WebDataset's convention) and each shard's index beside it (``.idx``, written by DALI's own
    ``wds2idx``, which ``fn.readers.webdataset`` reads). Returns the shard paths."""
    from wds2idx import IndexCreator  # ships with DALI (the `wds2idx` command)

    if shard_size < 1:
        raise ValueError(f"shard_size must be positive, got {shard_size}")
    shards: list[Path] = []
    tar = None
    try:
        for i, (jpeg, label) in enumerate(samples):
            if i % shard_size == 0:
                if tar is not None:
                    tar.close()
                shards.append(Path(folder) / f"{split}-{len(shards):06d}.tar")
                tar = tarfile.open(shards[-1], "w", format=tarfile.USTAR_FORMAT)
            for name, data in ((f"{i:06d}.jpg", jpeg), (f"{i:06d}.cls", str(int(label)).encode("ascii"))):
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = len(data), 0o644, 0  # mtime 0: the same bytes every build
                tar.addfile(info, io.BytesIO(data))
    finally:
        if tar is not None:
            tar.close()
    for shard in shards:
        with IndexCreator(str(shard), str(shard.with_suffix(".idx")), verbose=False) as creator:
            creator.create_index()
    return shards
