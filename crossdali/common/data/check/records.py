"""Reading TFRecord, MXNet RecordIO and WebDataset files record by record through their index,
checking that the index and the records agree (the fast pass of ``crossdali check`` for record
formats). A WebDataset "record" is one sample: the tar members sharing a base name.

DALI reads only what the index lists, at the offsets it lists: a stale index makes it parse
garbage (measured: "Error while parsing TFRecord file: ... record payload length:
782134936810291200 bytes"), a RecordIO index that points past the end stops it with
``Assert on "current_file_index_ + 1 < paths_.size()" failed``, and records missing from an index
are never read, silently. The framing of both formats is a few lines of spec, parsed here; the
TFRecord ``Example`` protobuf is walked by hand too (the ``tfrecord`` package's protobuf module
clashes with TensorFlow's in one process, see ``crossdali.common.data.sample_data.formats``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from crossdali.common.data.formats import WEBDATASET_IMAGE_EXTENSIONS, WEBDATASET_LABEL_EXTENSION

__all__ = ["IndexEntry", "IndexProblem", "read_index", "check_index", "iter_records", "tfrecord_image",
           "recordio_image", "webdataset_image", "record_image", "write_index"]

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
    #: WebDataset: ``(extension, data offset, size, member name)`` of each of the sample's tar members
    components: tuple[tuple[str, int, int, str], ...] = ()
    #: WebDataset: the index's first line (``v1.2 <count>``), which a filtered copy must repeat
    header: str = ""


def rebuild_hint(fmt: str, rec: Path, idx: Path) -> str:
    if fmt == "tfrecord":
        return f"rebuild it with `tfrecord2idx {rec} {idx}` (ships with DALI)"
    if fmt == "webdataset":
        return f"rebuild it with `wds2idx {rec} {idx}` (ships with DALI)"
    return f"rebuild {idx} by re-running im2rec.py, or by reading {rec} with mxnet.recordio.MXRecordIO and writing the offsets"


def read_index(fmt: str, index: Path) -> list[IndexEntry]:
    """The index lines as entries; ``IndexProblem`` for a line that is not ``offset length``
    (TFRecord, DALI's ``tfrecord2idx``) or ``key<TAB>offset`` (RecordIO); WebDataset: ``_read_wds_index``."""
    if fmt == "webdataset":
        return _read_wds_index(index)
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


def _read_wds_index(index: Path) -> list[IndexEntry]:
    """DALI's WebDataset index (``wds2idx``): ``v1.2 <samples>``, then one line per sample of
    ``<ext> <offset> <size> <name>`` per component (v1.1: without ``<name>``)."""
    with open(index, encoding="utf-8", errors="replace") as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
    head = lines[0].split() if lines else []
    if len(head) != 2 or head[0] not in ("v1.1", "v1.2") or not head[1].isdigit():
        raise IndexProblem(f"{index}:1: expected a WebDataset index header 'v1.2 <samples>' (DALI's wds2idx), "
                           f"got {lines[0] if lines else 'an empty file'!r}")
    width = 4 if head[0] == "v1.2" else 3
    entries = []
    for n, line in enumerate(lines[1:], 2):
        parts = line.split()
        try:
            if not parts or len(parts) % width:
                raise ValueError
            comps = tuple((parts[i], int(parts[i + 1]), int(parts[i + 2]), parts[i + 3] if width == 4 else "")
                          for i in range(0, len(parts), width))
        except ValueError:
            raise IndexProblem(f"{index}:{n}: expected '<ext> <offset> <size>{' <name>' if width == 4 else ''}' "
                               f"per component, got {line!r}") from None
        key = comps[0][3].rsplit(".", len(comps[0][0].split(".")))[0] if comps[0][3] else str(len(entries))
        entries.append(IndexEntry(len(entries), comps[0][1], None, key=key, line=line, components=comps,
                                  header=head[0]))
    if int(head[1]) != len(entries):
        raise IndexProblem(f"{index}:1: the header says {head[1]} samples but {len(entries)} lines follow")
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
    if fmt == "webdataset":
        problems += _wds_members_problems(rec, idx, entries, hint)
    offsets = [e.offset for e in entries]
    if offsets != sorted(offsets) or len(set(offsets)) != len(offsets):
        problems.append(f"has an index {idx} whose offsets are not strictly increasing (duplicated or reordered "
                        f"lines): {hint}")
    return problems


def _wds_members_problems(rec: Path, idx: Path, entries: list[IndexEntry], hint: str) -> list[str]:
    """Tar members the index does not list (DALI never reads them), read from the tar headers."""
    import tarfile

    members: set[str] = set()
    try:
        with tarfile.open(rec) as tar:
            for m in tar:
                if m.isfile():
                    members.add(m.name)
    except tarfile.ReadError as e:
        if "unexpected end of data" not in str(e):
            return [f"is not a readable tar archive ({e})"]
        # cut short: the members before the cut were read, each record past it is reported on its own
    except (tarfile.TarError, OSError) as e:
        return [f"is not a readable tar archive ({e})"]
    listed = {c[3] for e in entries for c in e.components if c[3]}
    hidden = {m for m in members if Path(m).name.startswith(".")}  # wds2idx leaves these out, as DALI does
    missing = sorted(members - listed - hidden) if listed else []
    if missing:
        return [f"holds {len(missing)} files its index {idx} does not list (the first: {missing[0]}); they are "
                f"never read (a stale or incomplete index): {hint}"]
    return []


def _iter_webdataset(rec: Path, entries: list[IndexEntry]):
    """``iter_records`` for WebDataset: each component is checked against the tar header that
    precedes it (name and size), so a stale index is named, not read as garbage."""
    import tarfile

    size = rec.stat().st_size
    with open(rec, "rb") as f:
        for e in entries:
            payload, problem = {}, None
            for ext, offset, length, name in e.components:
                if offset < 512 or offset + length > size:
                    problem = (f"frame:lists {name or ext} at bytes {offset}-{offset + length}, past the end of the file "
                               f"({size} bytes)")
                    break
                f.seek(offset - 512)
                try:
                    info = tarfile.TarInfo.frombuf(f.read(512), "utf-8", "surrogateescape")
                except tarfile.HeaderError:
                    info = None
                if info is None or info.size != length or (name and not name.endswith(info.name.lstrip("./"))):
                    found = f"{info.name!r} ({info.size} bytes)" if info else "no tar header"
                    problem = f"frame:puts {name or ext} ({length} bytes) at byte {offset}, but the tar has {found} there"
                    break
                payload[ext] = f.read(length)
            yield e, (None if problem else payload), problem


def iter_records(fmt: str, rec: Path, entries: list[IndexEntry]) -> Iterator[tuple[IndexEntry, bytes | None, str | None]]:
    """``(entry, payload, problem)`` for every index entry, in index order, plus entries with
    ``position == -1`` for bytes that no index line covers (records DALI never reads). A problem
    is ``"<kind>:<text>"``: ``frame`` (no record where the index says), ``corrupt`` (checksum),
    ``gap:<bytes>`` (bytes in no index line). WebDataset payloads are ``{extension: bytes}``."""
    if fmt == "webdataset":
        yield from _iter_webdataset(rec, entries)
        return
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


def webdataset_image(payload: dict[str, bytes], *, image_extensions: tuple[str, ...],
                     label_extension: str) -> tuple[bytes | None, int | None]:
    """The image and the label of a WebDataset sample (``None`` where missing). ``ValueError`` if
    the label is not a non-negative decimal integer (what the pipeline's text-to-int reads)."""
    image = next((payload[ext] for ext in image_extensions if ext in payload), None)
    text = payload.get(label_extension)
    if text is None:
        return image, None
    value = text.decode("ascii", "replace").strip()
    if not value.isdigit() or len(value) > MAX_LABEL_DIGITS or len(text) > MAX_LABEL_TEXT_BYTES:
        raise ValueError(f".{label_extension} holds {text[:40]!r}, not a class index (0 to {10 ** MAX_LABEL_DIGITS - 1} "
                         f"as decimal text of at most {MAX_LABEL_TEXT_BYTES} bytes)")
    return image, int(value)


#: The longest ``.cls`` text the classification pipeline parses (``crossdali.common.classification``).
MAX_LABEL_DIGITS = 12
#: The most bytes of ``.cls`` text, whitespace included, that the pipeline reads (it parses a fixed window).
MAX_LABEL_TEXT_BYTES = 32


def record_image(fmt: str, payload, *, image_key: str, label_key: str):
    """(image bytes, label) of one record of any record format."""
    if fmt == "tfrecord":
        return tfrecord_image(payload, image_key=image_key, label_key=label_key)
    if fmt == "webdataset":
        return webdataset_image(payload, image_extensions=WEBDATASET_IMAGE_EXTENSIONS,
                                label_extension=WEBDATASET_LABEL_EXTENSION)
    return recordio_image(payload)


def write_index(entries: list[IndexEntry], path: Path, *, fmt: str = "") -> None:
    """An index with only ``entries`` (their original lines), for the exclusion of records."""
    head = f"{entries[0].header} {len(entries)}\n" if fmt == "webdataset" and entries else ""
    path.write_text(head + "".join(e.line + "\n" for e in entries), encoding="utf-8")
