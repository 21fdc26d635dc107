"""An exclusion list always lets training run on what is left: a record file cut short keeps its
intact records, a file a list names but that is gone can be excluded, the command a refusal
suggests runs and writes the list; and where nothing is left, the message says why and what to run."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from crossdali.common.data.sources import resolve_source
from crossdali.common.errors import DataError
from tests.conformance.corpus import case_bytes, image_folder

RECORDS = {"tfrecord": "val.tfrecord", "recordio": "val.rec", "webdataset": "val-000000.tar"}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CROSSDALI_CACHE", str(tmp_path / "cache"))


def _read_all(source) -> int:
    """Samples one epoch of DALI's own reader and decoder yields for ``source`` (CPU)."""
    from crossdali.common.classification import ClassificationTransform, PipelineOptions, create_classification_pipeline

    pipe = create_classification_pipeline(source, train=False, options=PipelineOptions(batch_size=1, num_threads=1),
                                          transform=ClassificationTransform(crop_size=16))
    pipe.build()
    for _ in range(source.num_samples):  # DALI stops on a record it cannot parse or decode
        pipe.run()
    return source.num_samples


@pytest.mark.parametrize("fmt", sorted(RECORDS))
def test_record_file_cut_short_keeps_its_intact_records(fmt, tiny_classification, tmp_path):
    from crossdali.common.data.check import check_data

    data = tmp_path / fmt
    shutil.copytree(tiny_classification / fmt, data)
    rec = data / RECORDS[fmt]
    whole = rec.read_bytes()
    rec.write_bytes(whole[: len(whole) * 2 // 3])  # an interrupted copy: the index still lists all 55
    with pytest.raises(DataError, match=rf"{RECORDS[fmt]} record #\d+ cannot be decoded: .*the file was cut short"):
        resolve_source(data, "val")
    report = check_data(data, splits=["val"], device="cpu")
    assert report.errors and all(p.code == "truncated" and "#" in p.sample for p in report.errors)
    _, exclude = report.write(tmp_path / "check")
    source = resolve_source(data, "val", exclude=exclude)
    assert source.num_samples == 55 - len(report.errors) > 30
    assert _read_all(source) == source.num_samples


def test_stale_index_excluded_whole_says_why_nothing_is_left(tiny_classification, tmp_path):
    from crossdali.common.data.check import check_data

    data = tmp_path / "tfrecord"
    shutil.copytree(tiny_classification / "tfrecord", data)
    idx = data / "val.idx"
    idx.write_text("".join(f"{int(a) + 7} {b}\n" for a, b in (ln.split() for ln in idx.read_text().splitlines())))
    report = check_data(data, splits=["val"], device="cpu")
    assert [p.sample for p in report.errors] == ["val.tfrecord"]
    _, exclude = report.write(tmp_path / "check")
    with pytest.raises(DataError, match=r"leaves out every record of .*1 record file whole .*val\.tfrecord.*its index "
                                        r"does not match it.*tfrecord2idx .*val\.idx.*crossdali check"):
        resolve_source(data, "val", exclude=exclude)


def test_missing_file_of_a_file_list_can_be_excluded(tiny_classification, tmp_path):
    photos = sorted((tiny_classification / "imagefolder" / "val" / "coffee").glob("*.jpg"))[:3]
    data = tmp_path / "list"
    (data / "img").mkdir(parents=True)
    for p in photos:
        shutil.copy(p, data / "img" / p.name)
    (data / "val.txt").write_text("".join(f"img/{p.name} 0\n" for p in photos) + "img/gone.jpg 1\n")
    with pytest.raises(DataError, match=r"val\.txt:4: .*img/gone\.jpg does not exist; .*crossdali check") as refused:
        resolve_source(data, "val")
    assert "\n" not in str(refused.value)
    check = subprocess.run([sys.executable, "-m", "crossdali", "check", str(data / "val.txt"), "--output-dir",
                            str(tmp_path / "check"), "--no-progress"], capture_output=True, text=True, timeout=300)
    assert check.returncode == 1 and "Traceback" not in check.stderr, check.stderr[-3000:]
    source = resolve_source(data, "val", exclude=tmp_path / "check" / "exclude.txt")
    assert source.num_samples == 3 and _read_all(source) == 3


@pytest.mark.parametrize("fmt", ["imagefolder", "tfrecord"])
def test_the_command_a_refusal_suggests_runs_and_its_list_lets_the_rest_load(fmt, tiny_classification, tmp_path):
    """The refusal's ``crossdali check ...`` is run as printed (in a folder whose name has a space):
    it exits 1 (bad samples found) and writes the exclusion list that the loader then accepts."""
    data = tmp_path / "my data"
    if fmt == "imagefolder":
        image_folder(data, tiny_classification, *case_bytes(tiny_classification)["truncated"])
        (data / "val").rename(data / "train")
        expected = 6
    else:
        shutil.copytree(tiny_classification / "tfrecord", data)
        (data / "val.tfrecord").rename(data / "train.tfrecord")
        (data / "val.idx").rename(data / "train.idx")
        rec = data / "train.tfrecord"
        rec.write_bytes(rec.read_bytes()[:-100])
        expected = 54
    with pytest.raises(DataError) as refused:
        resolve_source(data, "train")
    command = re.search(r"`(crossdali check [^`]+)`", str(refused.value))[1]
    out = tmp_path / "check"
    run = subprocess.run([sys.executable, "-m", *shlex.split(command), "--output-dir", str(out), "--no-progress"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path, env=dict(os.environ))
    assert run.returncode == 1, (command, run.stdout[-2000:], run.stderr[-3000:])
    assert resolve_source(data, "train", exclude=out / "exclude.txt").num_samples == expected
