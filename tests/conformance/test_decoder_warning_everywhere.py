"""A JPEG whose damage libjpeg-turbo only warns about ("Corrupt JPEG data: 58 extraneous bytes
before marker 0xd9") is a bad sample wherever it is stored: the fast check that runs before
training refuses it naming the file or record, ``crossdali check`` lists it, and its exclusion list
lets the rest load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from crossdali.common.data.sources import resolve_source
from crossdali.common.errors import DataError
from tests.conformance.corpus import case_bytes

FORMATS = ("imagefolder", "filelist", "tfrecord", "recordio", "webdataset")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CROSSDALI_CACHE", str(tmp_path / "cache"))


def _dataset(root: Path, tiny: Path, fmt: str, bad: bytes) -> tuple[Path, str]:
    """``root`` holding a val split of 5 good photos and ``bad`` last, in ``fmt``; and the bad sample's id."""
    from crossdali.common.data.sample_data.formats import write_recordio, write_tfrecord, write_webdataset

    photos = sorted((tiny / "imagefolder" / "val" / "coffee").glob("*.jpg"))[:5]
    samples = [(p.read_bytes(), 0) for p in photos] + [(bad, 1)]
    root.mkdir(parents=True)
    if fmt in ("imagefolder", "filelist"):
        folder = "val" if fmt == "imagefolder" else "images"
        for i, (data, label) in enumerate(samples):
            (root / folder / str(label)).mkdir(parents=True, exist_ok=True)
            (root / folder / str(label) / f"{i}.jpg").write_bytes(data)
        if fmt == "filelist":
            (root / "val.txt").write_text("".join(f"{folder}/{label}/{i}.jpg {label}\n" for i, (_, label) in enumerate(samples)))
        return root, f"{folder}/1/5.jpg"
    if fmt == "tfrecord":
        write_tfrecord(root / "val.tfrecord", samples)
        return root, "val.tfrecord#5"
    if fmt == "recordio":
        write_recordio(root / "val.rec", samples)
        return root, "val.rec#5"
    write_webdataset(root, "val", samples)
    return root, "val-000000.tar#5"


@pytest.mark.parametrize("fmt", FORMATS)
def test_fast_check_refuses_a_jpeg_the_decoder_warns_about(fmt, tiny_classification, tmp_path):
    from crossdali.common.data.check import check_data

    _, bad = case_bytes(tiny_classification)["junk-before-eoi"]
    root, sample = _dataset(tmp_path / fmt, tiny_classification, fmt, bad)
    with pytest.raises(DataError, match=r"extraneous bytes before marker 0xd9") as refused:
        resolve_source(root, "val")  # what every loader and training script runs first
    assert sample.split("#")[0].rsplit("/", 1)[-1] in str(refused.value)
    report = check_data(root, splits=["val"], device="cpu")
    assert [(p.sample, p.code, p.depth) for p in report.errors] == [(sample, "decoder-warning", "fast")]
    _, exclude = report.write(tmp_path / "check")
    assert resolve_source(root, "val", exclude=exclude).num_samples == 5


def test_coco_image_the_decoder_warns_about_is_refused(tmp_path, data_root):
    from crossdali.common.data.check import check_data
    from crossdali.common.data.sample_data.detection import ensure_detection
    from crossdali.common.detection import resolve_detection_source

    root = tmp_path / "coco"
    shutil.copytree(ensure_detection(data_root, "tiny"), root)
    coco = json.loads((root / "annotations" / "instances_val.json").read_text())
    name = coco["images"][0]["file_name"]
    good = (root / "val" / name).read_bytes()
    (root / "val" / name).write_bytes(good[:-2] + bytes(range(1, 65)) + good[-2:])
    with pytest.raises(DataError, match=rf"{name} makes the JPEG decoder warn \(Corrupt JPEG data"):
        resolve_detection_source(root, "val")
    report = check_data(root, splits=["val"], device="cpu")
    assert [p.code for p in report.errors] == ["decoder-warning"]
    _, exclude = report.write(tmp_path / "check")
    assert resolve_detection_source(root, "val", exclude=exclude).num_images_total == len(coco["images"]) - 1
