"""The sample-data builder: deterministic, learnable classes, the same samples in every format."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from crossdali.common.data.sample_data import ClassificationSampleConfig, build_classification, class_names
from crossdali.common.data.sources import resolve_source

SMALL = ClassificationSampleConfig(train_per_class=2, val_per_class=1, min_side=40, max_side=60, seed=3)


def _digest(folder) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name != "manifest.json":
            h.update(path.relative_to(folder).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def test_deterministic_given_seed(tmp_path):
    a = build_classification(tmp_path / "a", SMALL)
    b = build_classification(tmp_path / "b", SMALL)
    assert _digest(a) == _digest(b)


def test_seed_changes_samples(tmp_path):
    a = build_classification(tmp_path / "a", SMALL)
    b = build_classification(tmp_path / "b", ClassificationSampleConfig(**{**SMALL.__dict__, "seed": 4}))
    assert _digest(a) != _digest(b)


def test_layout_counts_and_reuse(tmp_path):
    out = build_classification(tmp_path, SMALL)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["classes"] == class_names() and len(class_names()) == 11
    assert manifest["counts"] == {"train": 22, "val": 11}
    for split, n in manifest["counts"].items():
        assert len(list((out / "imagefolder" / split).glob("*/*.jpg"))) == n
        assert len((out / "tfrecord" / f"{split}.idx").read_text().splitlines()) == n
        assert len((out / "recordio" / f"{split}.idx").read_text().splitlines()) == n
    before = (out / "imagefolder" / "train.txt").stat().st_mtime_ns
    assert build_classification(tmp_path, SMALL) == out  # same config: reused, not rebuilt
    assert (out / "imagefolder" / "train.txt").stat().st_mtime_ns == before


def _encoded_samples(source):
    """Raw JPEG bytes and labels in reader order, straight from DALI's readers (CPU)."""
    from nvidia.dali import pipeline_def

    from crossdali.common.classification import PipelineOptions, _reader

    @pipeline_def(batch_size=source.num_samples, num_threads=1, device_id=None)
    def pipe():
        return _reader(source, train=False, opts=PipelineOptions(batch_size=source.num_samples))

    p = pipe()
    p.build()
    jpegs, labels = p.run()
    return [np.array(jpegs[i]).tobytes() for i in range(len(jpegs))], np.array(labels.as_tensor()).ravel().tolist()


@pytest.mark.parametrize("fmt", ["tfrecord", "recordio", "webdataset", "filelist"])
def test_every_format_holds_the_same_samples(tmp_path, fmt):
    out = build_classification(tmp_path, SMALL)
    ref = _encoded_samples(resolve_source(out / "imagefolder", "val", format="imagefolder"))
    folder = out / ("imagefolder" if fmt == "filelist" else fmt)
    assert _encoded_samples(resolve_source(folder, "val", format=fmt)) == ref


def test_formats_option_skips_record_formats(tmp_path):
    out = build_classification(tmp_path, SMALL, formats=("imagefolder",))
    assert (out / "imagefolder").is_dir() and not (out / "tfrecord").exists() and not (out / "recordio").exists()
    with pytest.raises(ValueError, match="imagefolder"):
        build_classification(tmp_path / "x", SMALL, formats=("tfrecord",))


def test_config_rejects_bad_sizes():
    with pytest.raises(ValueError, match="min_side"):
        ClassificationSampleConfig(min_side=300, max_side=200)
    with pytest.raises(ValueError, match="train_per_class"):
        ClassificationSampleConfig(train_per_class=0)
