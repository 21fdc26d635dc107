"""What an encoded image's bytes say without decoding its pixels at full size: format, size, and
whether its structure and (for a JPEG) its image data are whole (the fast pass of ``crossdali check``).

Pillow reads the header (format, width, height, mode) for every format DALI decodes; the marker
walk over a JPEG and the chunk walk over a PNG (with its CRCs) are written here because no
maintained library reports structure without decoding the pixels. A JPEG whose markers are whole
then has its entropy-coded data decoded by libjpeg-turbo (``simplejpeg``) at an eighth of its size,
in grey, with every warning an error: damage that the decoder only warns about ("Corrupt JPEG data:
N extraneous bytes before marker 0xd9", "premature end of data segment") and then trains on is
found there, which no marker walk can see (where the image data should end is known only by
decoding its Huffman codes). A header over ``DEFAULT_MAX_PIXELS`` is refused before that, so a
header that claims 30000x30000 costs nothing to refuse.
"""

from __future__ import annotations

import io
import re
import struct
import zlib
from dataclasses import dataclass, field

__all__ = ["DALI_FORMATS", "DEFAULT_MAX_PIXELS", "ImageInfo", "inspect_image", "EXTENSION_FORMATS"]

#: Formats DALI 2.4 decodes (Pillow's names). Measured: GIF fails with "nvImageCodec failure '#4'".
DALI_FORMATS = frozenset({"JPEG", "PNG", "BMP", "TIFF", "JPEG2000", "WEBP", "PPM"})
#: Pillow's own decompression-bomb limit (about 0.25 GiB of RGB pixels): the default ``max_pixels``.
DEFAULT_MAX_PIXELS = 89_478_485
#: What an extension promises; a file whose bytes are another format is reported as misnamed
#: (DALI sniffs the bytes, but the native loaders trust the name: tf.io.decode_jpeg reads JPEG only).
EXTENSION_FORMATS = {
    ".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".bmp": "BMP", ".tif": "TIFF", ".tiff": "TIFF",
    ".jp2": "JPEG2000", ".webp": "WEBP", ".pnm": "PPM", ".ppm": "PPM", ".pgm": "PPM", ".pbm": "PPM",
}
_SUGGESTED_EXT = {"JPEG": ".jpg", "PNG": ".png", "BMP": ".bmp", "TIFF": ".tif", "JPEG2000": ".jp2", "WEBP": ".webp",
                  "PPM": ".ppm"}
_TEXT_STARTS = (b"<", b"{", b"[", b"\xef\xbb\xbf<", b"%PDF")

# JPEG markers that may follow entropy-coded data (anything else there is corruption):
# SOFn, DHT, DAC, SOS, DQT, DNL, DRI, DHP, EXP, APPn, COM, EOI.
_AFTER_SCAN_OK = set(range(0xC0, 0xD0)) | {0xD9, 0xDA, 0xDB, 0xDC, 0xDD, 0xDE, 0xDF} | set(range(0xE0, 0xF0)) | {0xFE}
_SOF = set(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM and RSTn: no length field
# Pillow's mode of a JPEG by its frame's component count (it refuses other counts)
_JPEG_MODES = {1: "L", 3: "RGB", 4: "CMYK"}
# a marker inside entropy-coded data: 0xFF not followed by a stuffed 0x00, an RSTn or a fill 0xFF
_SCAN_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")


@dataclass
class ImageInfo:
    """The header of one encoded image; ``problems`` are ``(code, text)`` pairs about its structure."""

    format: str | None = None
    width: int = 0
    height: int = 0
    mode: str = ""
    problems: list[tuple[str, str]] = field(default_factory=list)

    @property
    def pixels(self) -> int:
        return self.width * self.height

    def to_json(self) -> dict:
        return {"format": self.format, "width": self.width, "height": self.height, "mode": self.mode,
                "problems": [list(p) for p in self.problems]}

    @classmethod
    def from_json(cls, d: dict) -> ImageInfo:
        return cls(format=d["format"], width=d["width"], height=d["height"], mode=d["mode"],
                   problems=[tuple(p) for p in d["problems"]])


def _jpeg_walk(data: bytes) -> tuple[tuple[int, int, int] | None, str | None]:
    """(width, height, components) from the first SOF, and what is wrong with the marker structure
    (or None)."""
    size, pos, n = None, 2, len(data)
    tables, component_table = 0, {}  # quantization tables defined so far (bit mask); component id -> its table
    while True:
        if pos + 2 > n:
            return size, f"ends after {n} bytes without the end-of-image marker (truncated)"
        if data[pos] != 0xFF:
            return size, f"has stray data at byte {pos} where a marker should start (corrupt)"
        while pos < n and data[pos] == 0xFF:  # fill bytes
            pos += 1
        if pos >= n:
            return size, f"ends after {n} bytes without the end-of-image marker (truncated)"
        marker = data[pos]
        pos += 1
        if marker == 0xD9:
            return size, None
        if marker in _STANDALONE:
            continue
        if pos + 2 > n:
            return size, f"ends after {n} bytes inside a segment header (truncated)"
        length = struct.unpack_from(">H", data, pos)[0]
        if length < 2:
            return size, f"has a segment of impossible length {length} at byte {pos} (corrupt)"
        if pos + length > n:
            return size, f"ends after {n} bytes inside a segment that needs {pos + length} (truncated)"
        if marker in _SOF and size is None and length >= 8:
            h, w, components = struct.unpack_from(">HHB", data, pos + 3)
            size = (w, h, components)
            component_table = {data[c]: data[c + 2] for c in range(pos + 8, min(pos + 8 + 3 * components,
                                                                                pos + length - 2), 3)}
        elif marker == 0xDB:
            tables = _quant_tables(data, pos, length, tables)
        elif marker == 0xDA and (problem := _scan_problem(data, pos, length, tables, component_table)):
            return size, problem
        pos += length
        if marker == 0xDA:  # entropy-coded data runs to the next real marker
            found = _next_marker(data, pos)
            if found is None:
                return size, f"ends after {n} bytes inside the image data (truncated)"
            start, pos = found
            if data[pos] not in _AFTER_SCAN_OK:
                return size, (f"has an invalid marker 0xFF{data[pos]:02X} inside its image data at byte {pos} "
                              "(corrupt data: decoders skip it with a warning and output damaged pixels)")
            pos = start


def _quant_tables(data: bytes, pos: int, length: int, tables: int) -> int:
    """``tables`` (a bit mask) with those the DQT segment at ``pos`` defines (each: a precision/id
    byte and 64 one- or two-byte entries)."""
    i, end = pos + 2, pos + length
    while i < end:
        tables |= 1 << (data[i] & 0x0F)
        i += 1 + 64 * ((data[i] >> 4) + 1)
    return tables


def _scan_problem(data: bytes, pos: int, length: int, tables: int, component_table: dict[int, int]) -> str | None:
    """What is wrong when the scan (SOS segment at ``pos``) names a component its frame lacks, or
    one whose quantization table no DQT segment has defined yet, else None.

    libjpeg-turbo refuses both. nvJPEG (DALI 2.4) decodes the first without an error when it follows a
    good JPEG in a batch, and can let the second through (``python -m benchmarks.probes.decode_failure_probe``
    shows it), so a dataset checked on the GPU could still stop a CPU-decoding job: both are checked
    here, on every device, without decoding."""
    for c in range(pos + 3, min(pos + 3 + 2 * data[pos + 2], pos + length), 2):
        table = component_table.get(data[c])
        if table is None and component_table:
            return (f"names component {data[c]} in the scan at byte {pos - 2}, which its frame (components "
                    f"{sorted(component_table)}) does not have (corrupt: the CPU decoder refuses it); re-encode "
                    "it from its source")
        if table is not None and not tables >> table & 1:
            return (f"uses quantization table {table} for component {data[c]}, which no DQT segment defines before "
                    f"its image data at byte {pos + length} (corrupt: the CPU decoder refuses it); re-encode it "
                    "from its source")
    return None


def _next_marker(data: bytes, pos: int) -> tuple[int, int] | None:
    """(where its 0xFF fill bytes start, where the marker byte is) of the first marker at or after
    ``pos`` in entropy-coded data: a 0xFF not followed by a stuffed 0x00, an RSTn or another 0xFF.

    The pattern matches one 0xFF and the marker byte, the fill bytes are walked back by hand: the
    earlier pattern with ``\\xff+`` in front ran the JPEG walk at 3,451 files/s on the bench set.
    """
    m = _SCAN_MARKER.search(data, pos)
    if m is None:
        return None
    start = m.start()
    while start > pos and data[start - 1] == 0xFF:
        start -= 1
    return start, m.start() + 1


def _png_walk(data: bytes) -> str | None:
    pos, n = 8, len(data)
    while pos + 12 <= n:
        length, ctype = struct.unpack_from(">I4s", data, pos)
        end = pos + 12 + length
        if end > n:
            return f"ends after {n} bytes inside its {ctype.decode('latin-1')!r} chunk (truncated)"
        if zlib.crc32(data[pos + 4: pos + 8 + length]) != struct.unpack_from(">I", data, pos + 8 + length)[0]:
            return f"has a bad checksum in its {ctype.decode('latin-1')!r} chunk at byte {pos} (corrupt)"
        if ctype == b"IEND":
            return None
        pos = end
    return f"ends after {n} bytes without its IEND chunk (truncated)"


def _bomb_size(data: bytes, error: Exception) -> tuple[int, int] | None:
    if data.startswith(b"\xff\xd8"):
        sof = _jpeg_walk(data)[0]
        return sof[:2] if sof else None
    m = re.search(r"\((\d+) pixels\)", str(error))
    return (int(m.group(1)), 1) if m else None


def inspect_image(data: bytes, *, extension: str | None = None) -> ImageInfo:
    """Format, size and structural problems of one encoded image (never decodes pixels).

    ``extension`` (``".jpg"``...) is what the file name promises; a mismatch is a problem.
    Problem codes: ``empty``, ``not-an-image``, ``unsupported-format``, ``misnamed``,
    ``truncated``, ``corrupt``. Size limits are applied by the caller (``ImageInfo.pixels``).
    """
    from PIL import Image, UnidentifiedImageError  # defer: PIL is only needed when checking

    info = ImageInfo()
    if not data:
        info.problems.append(("empty", "is empty (0 bytes)"))
        return info
    if data.startswith(b"\xff\xd8"):  # a whole JPEG with a frame header needs no Pillow: the walk has
        sof, problem = _jpeg_walk(data)  # it all (Pillow's header parse took 100 of 184 us a file on the bench set)
        if problem is None and sof is not None and sof[0] > 0 and sof[1] > 0 and sof[2] in _JPEG_MODES:
            info.format, info.width, info.height, info.mode = "JPEG", sof[0], sof[1], _JPEG_MODES[sof[2]]
            info.problems.extend(_entropy_problems(data, info))
            return _check_extension(info, extension)
    try:
        with Image.open(io.BytesIO(data)) as img:
            info.format, (info.width, info.height), info.mode = img.format, img.size, img.mode
    except Image.DecompressionBombError as e:
        size = _bomb_size(data, e)
        info.format = "JPEG" if data.startswith(b"\xff\xd8") else None
        info.width, info.height = size if size else (0, 0)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, struct.error) as e:
        walked = _jpeg_walk(data)[1] if data.startswith(b"\xff\xd8") else (
            _png_walk(data) if data.startswith(b"\x89PNG\r\n\x1a\n") else None)
        if walked:
            info.format = "JPEG" if data.startswith(b"\xff\xd8") else "PNG"
            info.problems.append(("truncated" if "truncated" in walked else "corrupt", walked))
            return info
        head = data[:64].lstrip()
        if head.startswith(_TEXT_STARTS) or head[:15].lower().startswith((b"<!doctype", b"<html")):
            what = "a PDF document" if head.startswith(b"%PDF") else "a text/HTML/XML file (an error page saved as an image?)"
            info.problems.append(("not-an-image", f"is {what}, not an image (starts with {data[:16]!r})"))
        else:  # Pillow's UnidentifiedImageError names its stream (a BytesIO repr), not the file: leave it out
            pillow = "Pillow cannot identify it" if isinstance(e, UnidentifiedImageError) else \
                f"Pillow: {type(e).__name__}: {e}"
            info.problems.append(("not-an-image", f"is not an image any decoder recognises (starts with {data[:8]!r}; "
                                                  f"{pillow})"))
        return info
    if info.format not in DALI_FORMATS:
        info.problems.append(("unsupported-format", f"is a {info.format} file, which DALI cannot decode "
                                                    "(it decodes JPEG, PNG, BMP, TIFF, JPEG 2000, WebP, PNM)"))
        return info
    if info.format == "JPEG":
        _, problem = _jpeg_walk(data)
        if problem:
            info.problems.append(("truncated" if "truncated" in problem else "corrupt", problem))
        else:
            info.problems.extend(_entropy_problems(data, info))
    elif info.format == "PNG":
        problem = _png_walk(data)
        if problem:
            info.problems.append(("truncated" if "truncated" in problem else "corrupt", problem))
    return _check_extension(info, extension)


def _entropy_problems(data: bytes, info: ImageInfo) -> list[tuple[str, str]]:
    """What libjpeg-turbo says about a JPEG's image data when it decodes it at 1/8 scale in grey
    (the Huffman decoding, the only way to find where the data ends, without the full-size inverse
    DCT, upsampling and colour conversion): ``decoder-warning`` for damage it would decode around,
    ``decode-failed`` for damage it stops on; nothing for a whole JPEG or one over the default size
    limit (refused from its header). It makes the fast pass several times slower than the marker walk
    alone: docs/data-checks.md#what-the-fast-pass-decodes."""
    import simplejpeg  # defer: only needed when checking

    if not 0 < info.pixels <= DEFAULT_MAX_PIXELS:
        return []
    colorspace = "CMYK" if info.mode == "CMYK" else "GRAY"  # libjpeg-turbo converts CMYK to nothing else
    try:
        simplejpeg.decode_jpeg(data, colorspace=colorspace, min_height=1, min_width=1, strict=True)
    except ValueError as strict_error:
        said = str(strict_error).strip().rstrip(".")
        try:
            simplejpeg.decode_jpeg(data, colorspace=colorspace, min_height=1, min_width=1, strict=False)
        except ValueError:
            # TurboJPEG's API refuses a few layouts that libjpeg decodes (unusual subsampling):
            # Pillow's libjpeg, at the same scale, has the last word on a failure
            refused = _pillow_refuses(data, info)
            return [("decode-failed", f"the JPEG decoder stops on it ({refused})")] if refused else []
        return [("decoder-warning", f"makes the JPEG decoder warn ({said})")]
    return []


def _pillow_refuses(data: bytes, info: ImageInfo) -> str | None:
    """Why Pillow cannot decode ``data`` (at 1/8 scale), or None when it can."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            img.draft(img.mode, (max(1, info.width // 8), max(1, info.height // 8)))
            img.load()
    except Exception as e:  # noqa: BLE001 - any decoder failure is the answer
        return re.sub(r"^tj\w*\(\): ", "", str(e).strip().rstrip(".")) or type(e).__name__
    return None


def _check_extension(info: ImageInfo, extension: str | None) -> ImageInfo:
    """``info`` with a ``misnamed`` problem when ``extension`` promises another format."""
    if extension is not None:
        promised = EXTENSION_FORMATS.get(extension.lower())
        if promised is not None and promised != info.format:
            info.problems.append(("misnamed", f"is a {info.format} image named {extension} (the native loaders trust the "
                                              f"name); rename it to {_SUGGESTED_EXT[info.format]} or re-encode it as "
                                              f"{promised}"))
    return info
