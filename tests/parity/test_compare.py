"""The parity comparison itself: passes on identical dumps, fails loudly (pair, split, batch,
sample, max abs diff) on any difference. Runs in the light parity environment (numpy only),
on the real dumps the framework sessions wrote when they are there."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from crossdali.parity import ParityError, compare, load_dump, mark_session_started, split_report

pytestmark = pytest.mark.parity


def _real_dumps() -> list[Path]:
    folder = os.environ.get("CROSSDALI_PARITY_DIR")
    return sorted(Path(folder).glob("*.npz")) if folder else []


@pytest.fixture
def two_dumps(tmp_path) -> Path:
    """Two copies of one real framework dump (or, where none was made, of a hand-made one)."""
    real = _real_dumps()
    if real:
        shutil.copy(real[0], tmp_path / "a.npz")
    else:
        import json

        rng = np.random.default_rng(0)
        arrays = {f"{s}/{i}/{k}": (rng.standard_normal((4, 3, 8, 8)).astype(np.float32) if k == "images"
                                   else np.arange(4, dtype=np.int64))
                  for s in ("train", "train_epoch2", "train_auto_augment", "val") for i in range(2)
                  for k in ("images", "labels")}
        meta = {"framework": "a", "config": {"seed": 7}, "layout": "NCHW", "data_digest": "x"}
        np.savez(tmp_path / "a.npz", __meta__=np.array(json.dumps(meta)), **arrays)
    shutil.copy(tmp_path / "a.npz", tmp_path / "b.npz")
    return tmp_path


def _rewrite(path: Path, edit) -> None:
    with np.load(path) as z:
        arrays = {k: z[k].copy() for k in z.files}
    edit(arrays)
    np.savez(path, **arrays)


def test_identical_dumps_pass(two_dumps):
    assert compare(two_dumps) == ["a", "b"]


def test_one_ulp_in_one_pixel_fails_naming_where(two_dumps):
    def perturb(arrays):
        img = arrays["val/1/images"]
        img.reshape(img.shape[0], -1)[2, 5] = np.nextafter(img.reshape(img.shape[0], -1)[2, 5], np.float32(np.inf))

    _rewrite(two_dumps / "b.npz", perturb)
    with pytest.raises(ParityError, match=r"a vs b, val: batch 1 sample 2 .*max abs diff [0-9.e-]+, 1 of \d+ values differ"):
        compare(two_dumps)


def test_label_difference_fails(two_dumps):
    def perturb(arrays):
        arrays["train/0/labels"][3] += 1

    _rewrite(two_dumps / "b.npz", perturb)
    with pytest.raises(ParityError, match=r"a vs b, train: batch 0 sample 3: labels"):
        compare(two_dumps)


def test_layout_transpose_mistake_fails(two_dumps):
    """A wrapper that forgot its HWC -> CHW transpose must not pass (same bytes, other shape)."""
    def perturb(arrays):
        for key in [k for k in arrays if k.endswith("images") and k.split("/")[0] in ("train", "val")]:
            arrays[key] = np.ascontiguousarray(arrays[key].transpose(0, 2, 3, 1))

    _rewrite(two_dumps / "b.npz", perturb)
    with pytest.raises(ParityError, match="images .* vs "):
        compare(two_dumps)


def test_split_report_names_every_differing_split_past_the_first(two_dumps):
    """The GPU harness's report goes on where ``compare`` stops: a difference in train does not hide one in val,
    and the splits that agree say so."""
    def perturb(arrays):
        arrays["train/0/labels"][1] += 1
        arrays["val/1/images"][0] += 1.0

    shutil.copy(two_dumps / "b.npz", two_dumps / "c.npz")
    _rewrite(two_dumps / "c.npz", perturb)
    report = split_report(two_dumps)
    assert report["train"].startswith("a vs c: batch 0 sample 1: labels")
    assert re.match(r"a vs c: batch 1 sample 0( \(label \d+\))?: images max abs diff 1\b", report["val"])
    assert report["train_epoch2"] == "identical: a, b, c"
    held = set(load_dump(two_dumps / "a.npz")[1])
    for split, verdict in report.items():  # the real dumps hold video and SSD splits too; the hand-made one does not
        if split not in ("train", "val"):
            assert verdict == ("identical: a, b, c" if split in held else "not compared: dumped by none"), split


def test_fewer_than_two_frameworks_fails(two_dumps):
    (two_dumps / "b.npz").unlink()
    with pytest.raises(ParityError, match="1 framework dump"):
        compare(two_dumps)


def test_failed_session_named_before_any_comparison(two_dumps):
    """A framework session that failed before its dump (CI: PyTorch's tests timed out) is named with
    its session, not hidden behind a follow-on comparison error of the dumps that do exist."""
    mark_session_started(two_dumps, "pytorch", "tests-pytorch")
    with pytest.raises(ParityError, match=r"missing framework dump.*pytorch: the tests-pytorch session started .* "
                                          r"never wrote its parity dump.*nox -s tests-pytorch parity"):
        compare(two_dumps, expect=["a", "pytorch"])
    with pytest.raises(ParityError, match=r"mxnet: no mxnet dump and no session started one"):
        compare(two_dumps, expect=["a", "mxnet"])
    assert compare(two_dumps, expect=["a", "b"]) == ["a", "b"]


def test_marking_deletes_the_old_dump(two_dumps):
    mark_session_started(two_dumps, "b", "tests-b")
    assert not (two_dumps / "b.npz").exists()
    with pytest.raises(ParityError, match="b: the tests-b session started"):
        compare(two_dumps, expect=["a", "b"])


def test_real_framework_dumps_identical():
    """The frameworks' own dumps (nox's tests-<framework> sessions write them) agree bit for bit."""
    real = _real_dumps()
    if len(real) < 2:
        pytest.skip(f"{len(real)} framework dump(s) in $CROSSDALI_PARITY_DIR; the parity session's "
                    "compare step fails on that, this test only adds the per-dump checks")
    names = compare(Path(os.environ["CROSSDALI_PARITY_DIR"]))
    assert len(names) >= 2
    for path in real:
        meta, batches = load_dump(path)
        assert meta["layout"] == "NCHW" and {"train", "val"} <= set(batches)
        train, val = batches["train"][0][0], batches["val"][0][0]
        assert train.shape == val.shape and not np.array_equal(train, val)  # real, augmented images
