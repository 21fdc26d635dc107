"""Reading TFRecord and MXNet RecordIO files record by record through their index, checking that
the index and the records agree (the fast pass of ``crossdali check`` for record formats).

DALI reads only what the index lists, at the offsets it lists: a stale index makes it parse
garbage (measured: "Error while parsing TFRecord file: ... record payload length:
782134936810291200 bytes"), a RecordIO index that points past the end stops it with
``Assert on "current_file_index_ + 1 < paths_.size()" failed``, and records missing from an index
are never read, silently. The framing of both formats is a few lines of spec, parsed here; the
TFRecord ``Example`` protobuf is walked by hand too (the ``tfrecord`` package's protobuf module
clashes with TensorFlow's in one process, see ``crossdali.common.sample_data.formats``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["IndexEntry", "IndexProblem", "read_index", "check_index", "iter_records", "tfrecord_image",
           "recordio_image", "write_index"]

_RECORDIO_MAGIC = 0xCED7230A
_IRHEADER = struct.Struct("<IfQQ")


class IndexProblem(ValueError):
    """The index and the record file disagree; the message says where and how to rebuild it."""


@dataclass(frozen=True)
class IndexEntry:
    """Record ``position`` (its line in the index, 0-based) at byte ``offset``; ``key`` is RecordIO's id."""

    position: int
    offset: int
    length: int | None  # TFRecord: from the index; RecordIO: known after reading the header
    key: str = ""
    line: str = ""


def rebuild_hint(fmt: str, rec: Path, idx: Path) -> str:
    if fmt == "tfrecord":
        return f"rebuild it with `tfrecord2idx {rec} {idx}` (ships with DALI)"
    return f"rebuild {idx} by re-running im2rec.py, or by reading {rec} with mxnet.recordio.MXRecordIO and writing the offsets"


def read_index(fmt: str, index: Path) -> list[IndexEntry]:
    """The index lines as entries; ``IndexProblem`` for a line that is not ``offset length``
    (TFRecord, DALI's ``tfrecord2idx``) or ``key<TAB>offset`` (RecordIO)."""
    entries = []
    with open(index, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            try:
                if fmt == "tfrecord":
                    offset, length = int(parts[0]), int(parts[1])
                    entries.append(IndexEntry(len(entries), offset, length, line=line.rstrip("\n")))
                else:
                    entries.append(IndexEntry(len(entries), int(parts[1]), None, key=parts[0], line=line.rstrip("\n")))
            except (ValueError, IndexError):
                want = "'<offset> <length>'" if fmt == "tfrecord" else "'<key><TAB><offset>'"
                raise IndexProblem(f"{index}:{n}: expected {want}, got {line.rstrip()!r}") from None
    return entries


def _frame(fmt: str, data: bytes, entry: IndexEntry, size: int) -> tuple[int, int] | str:
    """(payload start, payload length) of the record at ``entry.offset`` in the first bytes ``data``,
    or why no record starts there."""
    if fmt == "tfrecord":
        import crc32c  # defer: the record checks need it, nothing else does

        if len(data) < 12:
            return "the file ends there"
        (length,) = struct.unpack_from("<Q", data)
        (crc,) = struct.unpack_from("<I", data, 8)
        if _masked(crc32c.crc32c(data[:8])) != crc:
            return "no record starts there: length checksum mismatch"
        if entry.length is not None and entry.length != length + 16:
            return f"the index says {entry.length} bytes but the record there has {length + 16}"
        return 12, length
    if len(data) < 8:
        return "the file ends there"
    magic, lrec = struct.unpack_from("<II", data)
    if magic != _RECORDIO_MAGIC:
        return f"no record starts there: magic {magic:#x}, expected {_RECORDIO_MAGIC:#x}"
    if lrec >> 29:
        return "the record there is split over several chunks (multi-part records are not supported by DALI)"
    return 8, lrec & ((1 << 29) - 1)


def _masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def check_index(fmt: str, rec: Path, idx: Path, entries: list[IndexEntry]) -> list[str]:
    """Whole-file problems of an index: offsets out of order or repeated. (Each listed record, and
    the bytes no line covers, are checked when the records are read: ``iter_records``.)"""
    problems = []
    hint = rebuild_hint(fmt, rec, idx)
    offsets = [e.offset for e in entries]
    if offsets != sorted(offsets) or len(set(offsets)) != len(offsets):
        problems.append(f"has an index {idx} whose offsets are not strictly increasing (duplicated or reordered "
                        f"lines): {hint}")
    return problems


def iter_records(fmt: str, rec: Path, entries: list[IndexEntry]) -> Iterator[tuple[IndexEntry, bytes | None, str | None]]:
    """``(entry, payload, problem)`` for every index entry, in index order, plus entries with
    ``position == -1`` for bytes that no index line covers (records DALI never reads). A problem
    is ``"<kind>:<text>"``: ``frame`` (no record where the index says), ``corrupt`` (checksum),
    ``gap:<bytes>`` (bytes in no index line)."""
    size = rec.stat().st_size
    end_of_last = 0
    with open(rec, "rb") as f:
        for e in entries:
            if e.offset > end_of_last:
                yield IndexEntry(-1, end_of_last, None), None, f"gap:{e.offset - end_of_last}"
            if e.offset >= size:
                yield e, None, f"frame:is listed at byte {e.offset}, past the end of the file ({size} bytes)"
                continue
            f.seek(e.offset)
            head = f.read(12)
            framed = _frame(fmt, head, e, size)
            if isinstance(framed, str):
                end_of_last = size  # the file cannot be followed any further
                yield e, None, f"frame:is not at byte {e.offset}, where the index puts it ({framed})"
                continue
            start, length = framed
            trailer = 4 if fmt == "tfrecord" else (-length % 4)
            if e.offset + start + length + trailer > size:
                yield e, None, (f"frame:is truncated: it needs {start + length + trailer} bytes from byte {e.offset} but "
                                f"the file ends after {size - e.offset}")
                continue
            f.seek(e.offset + start)
            payload = f.read(length)
            if fmt == "tfrecord":
                import crc32c

                (crc,) = struct.unpack("<I", f.read(4))
                if _masked(crc32c.crc32c(payload)) != crc:
                    yield e, None, f"corrupt:fails its data checksum (corrupt bytes at {e.offset}-{e.offset + 16 + length})"
                    continue
            end_of_last = max(end_of_last, e.offset + start + length + trailer)
            yield e, payload, None
    if entries and end_of_last < size:
        yield IndexEntry(-1, end_of_last, None), None, f"gap:{size - end_of_last}"


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, bytes | int]]:
    """(field number, wire type, value) of a protobuf message (wire types 0, 1, 2, 5)."""
    pos, n = 0, len(buf)
    while pos < n:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            length, pos = _varint(buf, pos)
            value, pos = buf[pos: pos + length], pos + length
            if pos > n:
                raise ValueError("length-delimited field runs past the message")
        elif wire == 1:
            value, pos = buf[pos: pos + 8], pos + 8
        elif wire == 5:
            value, pos = buf[pos: pos + 4], pos + 4
        else:
            raise ValueError(f"wire type {wire}")
        yield number, wire, value


def tfrecord_image(payload: bytes, *, image_key: str, label_key: str) -> tuple[bytes | None, int | None]:
    """The image bytes and the label of a ``tf.train.Example`` (``None`` where a key is missing).

    ``Example{features=1: Features{feature=1: map<string, Feature>}}``; ``Feature{bytes_list=1,
    float_list=2, int64_list=3}``, each a list in field 1. Raises ``ValueError`` if it is not an Example.
    """
    image = label = None
    for number, _, features in _fields(payload):
        if number != 1:
            continue
        for fnum, _, entry in _fields(features):
            if fnum != 1:
                continue
            key, feature = None, b""
            for enum_, _, v in _fields(entry):
                if enum_ == 1:
                    key = bytes(v).decode("utf-8", "replace")
                elif enum_ == 2:
                    feature = v
            if key not in (image_key, label_key):
                continue
            for kind, _, lst in _fields(feature):
                values = [v for num, _, v in _fields(lst) if num == 1]
                if key == image_key and kind == 1 and values:
                    image = bytes(values[0])
                elif key == label_key and kind == 3 and values:
                    v = values[0]
                    label = _varint(v, 0)[0] if isinstance(v, bytes) else v  # packed or not
    return image, label


def recordio_image(payload: bytes) -> tuple[bytes, float]:
    """Image bytes and label of an im2rec record (``IRHeader`` + image; ``flag`` > 0 means that
    many float labels follow the header)."""
    if len(payload) < _IRHEADER.size:
        raise ValueError(f"record of {len(payload)} bytes is shorter than its {_IRHEADER.size}-byte header")
    flag, label, _, _ = _IRHEADER.unpack_from(payload)
    start = _IRHEADER.size + 4 * flag
    return payload[start:], label


def write_index(entries: list[IndexEntry], path: Path) -> None:
    """An index with only ``entries`` (their original lines), for the exclusion of records."""
    path.write_text("".join(e.line + "\n" for e in entries), encoding="utf-8")
