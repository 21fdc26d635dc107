"""WebDataset shards: the sample set's shards, the label text parsed inside the pipeline, and the
checks that refuse a broken shard or index before DALI reads it (CPU, real tar files)."""

from __future__ import annotations

import io
import shutil
import tarfile

import numpy as np
import pytest

from crossdali.common.data.sources import resolve_source
from crossdali.common.errors import DataError


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CROSSDALI_CACHE", str(tmp_path / "cache"))


def _photos(tiny, n=6):
    return [p.read_bytes() for p in sorted((tiny / "imagefolder" / "val").glob("*/*.jpg"))[:n]]


def _shard(path, members: list[tuple[str, bytes]]):
    """A tar of ``members`` and its index by DALI's wds2idx."""
    from wds2idx import IndexCreator

    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with IndexCreator(str(path), str(path.with_suffix(".idx")), verbose=False) as creator:
        creator.create_index()
    return path


def _labels(source, batch_size):
    from crossdali.common.classification import ClassificationTransform, PipelineOptions, create_classification_pipeline

    pipe = create_classification_pipeline(source, train=False, options=PipelineOptions(batch_size=batch_size,
                                                                                        num_threads=1),
                                          transform=ClassificationTransform(crop_size=16))
    pipe.build()
    _, labels = pipe.run()
    return [int(x) for x in labels.as_array().ravel()]


def test_sample_set_shards_are_found_and_split(tiny_classification):
    folder = tiny_classification / "webdataset"
    train = resolve_source(folder, "train")
    assert train.format == "webdataset" and train.num_samples == 264
    assert [p.rsplit("/", 1)[1] for p in train.paths] == ["train-000000.tar", "train-000001.tar"]  # 256 a shard
    assert all(i.endswith(".idx") for i in train.index_paths)


def test_label_text_is_parsed_in_the_pipeline(tmp_path, tiny_classification):
    """WebDataset writers differ in how they write ``.cls``: bare digits, a newline, spaces."""
    texts = [b"0", b"7", b"12\n", b" 345 ", b"999999999999", b"42"]
    photos = _photos(tiny_classification)
    _shard(tmp_path / "val-000000.tar", [m for i, (t, jpg) in enumerate(zip(texts, photos))
                                         for m in ((f"s{i}.jpg", jpg), (f"s{i}.cls", t))])
    assert _labels(resolve_source(tmp_path, "val"), len(texts)) == [0, 7, 12, 345, 999999999999, 42]


def _parse(texts: list[bytes]) -> list[np.ndarray]:
    """``decimal_text_to_int`` of ``texts`` as one batch, in a CPU pipeline (real DALI outputs)."""
    from nvidia.dali import fn, pipeline_def, types

    from crossdali.common.classification import decimal_text_to_int

    @pipeline_def(batch_size=len(texts), num_threads=1, device_id=None)
    def pipe():
        text = fn.external_source(source=lambda: [np.frombuffer(t, dtype=np.uint8) for t in texts], batch=True,
                                  dtype=types.UINT8, ndim=1)
        return decimal_text_to_int(text)

    p = pipe()
    p.build()
    (labels,) = p.run()
    return [np.array(labels.at(i)) for i in range(len(texts))]


# Every text the checker accepts, in one batch of mixed lengths: 1 to MAX_LABEL_DIGITS digits,
# leading zeros, whitespace before and after, up to MAX_LABEL_TEXT_BYTES bytes in all.
ACCEPTED_LABEL_TEXTS = [b"0", b"7", b"42", b"12\n", b"12\r\n", b" 345 ", b"\t8\t", b"007", b"0000", b"10\n",
                        b"999999999999", b"100000000000", b"123456789012\r\n", b"000000000017",
                        b"  000000000017\r\n", b" " * 20 + b"123456789012", b"5" + b" " * 31,
                        b"\x0b\x0c 99 \x1c\x1d\x1e\x1f"]


def test_label_text_parse_equals_int_for_every_accepted_text():
    from crossdali.common.data.check.records import MAX_LABEL_DIGITS, MAX_LABEL_TEXT_BYTES, webdataset_image

    def accepted(t):
        return webdataset_image({"cls": t}, image_extensions=("jpg",), label_extension="cls")[1]

    assert max(len(t.strip()) for t in ACCEPTED_LABEL_TEXTS) == MAX_LABEL_DIGITS
    assert max(len(t) for t in ACCEPTED_LABEL_TEXTS) == MAX_LABEL_TEXT_BYTES
    want = [int(t.decode("ascii").strip()) for t in ACCEPTED_LABEL_TEXTS]  # str.strip: as the checker
    assert [accepted(t) for t in ACCEPTED_LABEL_TEXTS] == want  # the checker lets each through
    got = _parse(ACCEPTED_LABEL_TEXTS)
    assert all(g.dtype == np.int64 and g.shape == (1,) for g in got)
    assert [int(g[0]) for g in got] == want
    for t in ACCEPTED_LABEL_TEXTS[:4]:  # alone, too (a batch of one sample of that length)
        assert int(_parse([t])[0][0]) == int(t.decode("ascii").strip())


def test_refused_label_text_gives_a_number_without_error():
    """What the checker refuses never reaches the reader; the parse still must not fail on it."""
    from crossdali.common.data.check.records import webdataset_image

    refused = [b"", b"cat", b"1 2", b"-3", b"9" * 13, b"9" * 40, b" " * 30 + b"123", b"\xff7"]
    for t in refused:
        with pytest.raises(ValueError, match="not a class index"):
            webdataset_image({"cls": t}, image_extensions=("jpg",), label_extension="cls")
    got = _parse(refused)
    assert all(g.dtype == np.int64 and g.shape == (1,) for g in got)
    assert int(got[0][0]) == int(got[1][0]) == 0  # no digit: 0


def test_missing_index_names_wds2idx(tmp_path, tiny_classification):
    shutil.copytree(tiny_classification / "webdataset", tmp_path / "w")
    (tmp_path / "w" / "val-000000.idx").unlink()
    with pytest.raises(DataError, match=r"val-000000\.tar has no index file .*val-000000\.idx.*`wds2idx "):
        resolve_source(tmp_path / "w", "val")


def test_stale_index_and_unlisted_members_are_refused(tmp_path, tiny_classification):
    photos = _photos(tiny_classification)

    def members(seq):
        return [m for i, jpg in enumerate(seq) for m in ((f"s{i}.jpg", jpg), (f"s{i}.cls", b"3"))]

    shard = _shard(tmp_path / "val-000000.tar", members(photos))
    index = shard.with_suffix(".idx").read_text()
    _shard(shard, members(photos[::-1]))
    shard.with_suffix(".idx").write_text(index)  # the old index beside a rewritten tar
    with pytest.raises(DataError, match=r"val-000000\.tar does not match its index .*6 of 6 records .*line 2, puts s0\.jpg "
                                        r"\(\d+ bytes\) at byte 512, but the tar has 's0\.jpg' .*`wds2idx "):
        resolve_source(tmp_path, "val")
    _shard(shard, members(photos))
    lines = index.splitlines()
    shard.with_suffix(".idx").write_text(f"v1.2 {len(lines) - 2}\n" + "\n".join(lines[1:-1]) + "\n")
    with pytest.raises(DataError, match=r"holds 2 files its index .* does not list \(the first: s5\.cls\)"):
        resolve_source(tmp_path, "val")


def test_bad_samples_are_named_and_excluded(tmp_path, tiny_classification):
    from crossdali.common.data.check import check_data

    photos = _photos(tiny_classification)
    members = [m for i, jpg in enumerate(photos) for m in ((f"s{i}.jpg", jpg), (f"s{i}.cls", b"3"))]
    members += [("t0.jpg", photos[0]), ("t0.cls", b"cat"),  # a label that is not a class index
                ("t1.jpg", photos[1]),  # no label at all
                ("t2.txt", b"caption"), ("t2.cls", b"1"),  # no image
                ("t3.jpg", b"GIF89a" + bytes(100)), ("t3.cls", b"1")]  # a GIF named .jpg
    _shard(tmp_path / "val-000000.tar", members)
    with pytest.raises(DataError, match=r"4 of 10 samples .*record #6 is not a valid record \(\.cls holds b'cat'"):
        resolve_source(tmp_path, "val")
    report = check_data(tmp_path, device="cpu")
    assert [(p.sample, p.code) for p in report.errors] == [
        ("val-000000.tar#6", "bad-record"), ("val-000000.tar#7", "no-label"),
        ("val-000000.tar#8", "bad-record"), ("val-000000.tar#9", "not-an-image")]
    _, exclude = report.write(tmp_path / "check")
    source = resolve_source(tmp_path, "val", exclude=exclude)
    assert source.num_samples == 6 and source.index_paths[0] != str(tmp_path / "val-000000.idx")
    assert _labels(source, 6) == [3] * 6


def test_val_pixels_equal_the_image_folder(tiny_classification):
    from crossdali.common.classification import ClassificationTransform, PipelineOptions, create_classification_pipeline

    out = {}
    for fmt in ("imagefolder", "webdataset"):
        pipe = create_classification_pipeline(resolve_source(tiny_classification / fmt, "val"), train=False,
                                              options=PipelineOptions(batch_size=16, num_threads=1),
                                              transform=ClassificationTransform(crop_size=32))
        pipe.build()
        out[fmt] = [tuple(np.array(o.as_tensor()) for o in pipe.run()) for _ in range(2)]
    for (ia, la), (ib, lb) in zip(out["imagefolder"], out["webdataset"]):
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(la, lb)
