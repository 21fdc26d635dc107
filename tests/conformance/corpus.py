"""A corpus of bad (and odd but good) inputs, built from the sample photos, for the check's unit
tests and the cross-framework conformance suite. Each case is one image added to a small
ImageFolder; ``EXPECTED`` is the verdict every framework's loader must reach."""

from __future__ import annotations

import io
import shutil
import struct
from pathlib import Path

import numpy as np


def _photo(tiny: Path) -> bytes:
    return sorted((tiny / "imagefolder" / "val" / "astronaut").glob("*.jpg"))[0].read_bytes()


def _pil(img_bytes: bytes):
    from PIL import Image

    return Image.open(io.BytesIO(img_bytes)).convert("RGB")


def _save(img, fmt: str, **kw) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt, **kw)
    return out.getvalue()


def _sos_end(jpeg: bytes) -> int:
    i = jpeg.index(b"\xff\xda")
    return i + 2 + struct.unpack(">H", jpeg[i + 2: i + 4])[0]


def header_segments(jpeg: bytes) -> list[tuple[int, int, int]]:
    """``(marker, start, end)`` of every segment from after SOI through the first SOS (its header),
    ``start`` at the segment's 0xFF: what the damaged cases below cut or patch."""
    out, pos = [], 2
    while True:
        marker, length = jpeg[pos + 1], struct.unpack(">H", jpeg[pos + 2: pos + 4])[0]
        out.append((marker, pos, pos + 2 + length))
        if marker == 0xDA:
            return out
        pos += 2 + length


def _without_dqt(jpeg: bytes) -> bytes:
    """A JPEG with no quantisation table: libjpeg-turbo refuses it, and so does the fast pass's
    marker walk (a GPU full pass can let one through: nvJPEG may decode it without an error)."""
    kept = b"".join(jpeg[a:b] for m, a, b in header_segments(jpeg)[:-1] if m != 0xDB)
    return jpeg[:2] + kept + jpeg[header_segments(jpeg)[-1][1]:]


def patched(jpeg: bytes, marker: int, offset: int, value: int) -> bytes:
    """``jpeg`` with byte ``offset`` of the first ``marker`` segment's payload set to ``value``."""
    start = next((a for m, a, _ in header_segments(jpeg) if m == marker), None)
    if start is None:
        raise ValueError(f"no 0xFF{marker:02X} segment before the scan")
    out = bytearray(jpeg)
    out[start + 4 + offset] = value
    return bytes(out)


def _bogus_huffman_table(jpeg: bytes) -> bytes:
    """A JPEG whose first Huffman table claims 255 codes of length 1: every marker is in place (the
    fast pass accepts it), and both of DALI's decoders refuse it when they parse the stream
    (benchmarks/probes/decode_failure_probe.py)."""
    return patched(jpeg, 0xC4, 1, 255)


def case_bytes(tiny: Path) -> dict[str, tuple[str, bytes]]:
    """case name -> (file name, bytes)."""
    good = _photo(tiny)
    img = _pil(good)
    start = _sos_end(good)
    # image data cut in the middle but the end marker kept: structure intact, libjpeg only warns
    # ("Corrupt JPEG data: premature end of data segment") and DALI trains on grey blocks
    cut = good[: start + (len(good) - start) // 2] + b"\xff\xd9"
    # bytes no decoder expects, with every marker in place: libjpeg-turbo only warns ("Corrupt JPEG
    # data: 58 extraneous bytes before marker 0xd9", "bad Huffman code") and outputs what it made of them
    junk = bytes(range(1, 65))  # no 0xFF: no marker, nothing for a marker walk to see
    middle = start + (len(good) - start) // 2
    marker = bytearray(good)
    marker[start + 100: start + 102] = b"\xff\x3a"  # an invalid marker inside the image data
    forged = bytearray(good)
    sof = next(i for i in range(len(good) - 1) if good[i] == 0xFF and good[i + 1] in (0xC0, 0xC1, 0xC2))
    forged[sof + 5: sof + 9] = struct.pack(">HH", 30000, 30000)
    exif_img = img.copy()
    exif = exif_img.getexif()
    exif[0x0112] = 6  # rotated 90 degrees
    arr16 = (np.asarray(img.convert("L"), dtype=np.uint16) * 257)
    from PIL import Image

    return {
        "good": ("good.jpg", good),
        "upper-ext": ("UPPER.JPG", good),
        "space-unicode": ("a file é.jpg", good),
        "grayscale": ("gray.jpg", _save(img.convert("L"), "JPEG")),
        "cmyk": ("cmyk.jpg", _save(img.convert("CMYK"), "JPEG")),
        "progressive": ("progressive.jpg", _save(img, "JPEG", progressive=True)),
        "exif-rotated": ("exif.jpg", _save(exif_img, "JPEG", exif=exif)),
        "one-pixel": ("one.jpg", _save(img.resize((1, 1)), "JPEG")),
        "png16": ("deep.png", _save(Image.fromarray(arr16), "PNG")),
        "empty": ("empty.jpg", b""),
        "html": ("page.jpg", b"<!DOCTYPE html><html><body>403 Forbidden</body></html>\n"),
        "gif": ("anim.jpg", _save(img, "GIF")),
        "png-as-jpg": ("png.jpg", _save(img, "PNG")),
        "webp-as-jpg": ("webp.jpg", _save(img, "WEBP")),
        "bmp-as-jpg": ("bmp.jpg", _save(img, "BMP")),
        "tiff-as-jpg": ("tiff.jpg", _save(img, "TIFF")),
        "truncated": ("truncated.jpg", good[: len(good) // 2]),
        "bad-marker": ("marker.jpg", bytes(marker)),
        "no-dqt": ("nodqt.jpg", _without_dqt(good)),
        "bad-huffman": ("badhuff.jpg", _bogus_huffman_table(good)),
        # the scan names component 9: nvJPEG decodes it after a good JPEG, libjpeg-turbo and the walk refuse it
        "bad-scan": ("badscan.jpg", patched(good, 0xDA, 1, 9)),
        "warning-only": ("warns.jpg", cut),
        "junk-before-eoi": ("junk_end.jpg", good[:-2] + junk + good[-2:]),
        "junk-in-scan": ("junk_scan.jpg", good[:middle] + junk + good[middle:]),
        "forged-30000": ("forged.jpg", bytes(forged)),
    }


#: verdict of every loader (fast check by default): "accept" or the problem code it is refused with
EXPECTED = {
    "good": "accept", "upper-ext": "accept", "space-unicode": "accept", "grayscale": "accept", "cmyk": "accept",
    "progressive": "accept", "exif-rotated": "accept", "one-pixel": "accept", "png16": "accept",
    "empty": "empty", "html": "not-an-image", "gif": "unsupported-format", "png-as-jpg": "misnamed",
    "webp-as-jpg": "misnamed", "bmp-as-jpg": "misnamed", "tiff-as-jpg": "misnamed", "truncated": "truncated",
    "bad-marker": "corrupt", "no-dqt": "corrupt", "bad-scan": "corrupt", "forged-30000": "too-large",
    # found by decoding the image data (the fast pass does, at 1/8 scale; the full pass with DALI)
    "bad-huffman": "decode-failed", "warning-only": "decoder-warning", "junk-before-eoi": "decoder-warning",
    "junk-in-scan": "decoder-warning",
}
#: cases found only by decoding the image data: the fast pass and the full pass must agree on them
DECODED = {"bad-huffman", "warning-only", "junk-before-eoi", "junk-in-scan"}
#: cases the fast pass cannot see (none: it decodes every JPEG's image data at 1/8 scale)
FULL_ONLY: set[str] = set()


def image_folder(root: Path, tiny: Path, name: str, data: bytes, *, per_class: int = 3) -> Path:
    """``root/val/{a,b}/`` with ``per_class`` good photos each, plus the case file in ``b``."""
    src = sorted((tiny / "imagefolder" / "val" / "astronaut").glob("*.jpg"))[:per_class]
    for cls in ("a", "b"):
        (root / "val" / cls).mkdir(parents=True, exist_ok=True)
        for f in src:
            shutil.copy(f, root / "val" / cls / f.name)
    (root / "val" / "b" / name).write_bytes(data)
    return root
