"""The loader contract on MXNet: state_dict/load_state_dict, a bit-exact mid-epoch resume of the
DALI iterator (DALI pipeline checkpoints), the order-only resume of ImageRecordIter, errors."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

mx = pytest.importorskip("mxnet")

from crossdali.common.data.sources import resolve_source  # noqa: E402
from crossdali.common.distributed import DistInfo  # noqa: E402
from crossdali.common.loading.loaders import Loader  # noqa: E402
from crossdali.mxnet import create_classification_loader  # noqa: E402

pytestmark = pytest.mark.mxnet
CROP = 16


def _rows(batch) -> tuple[np.ndarray, np.ndarray]:
    """Images and labels of a batch's real rows (copied: ImageRecordIter recycles its buffers)."""
    n = batch.data[0].shape[0] - batch.pad
    return batch.data[0].asnumpy()[:n].copy(), batch.label[0].asnumpy()[:n].copy()


def _epoch(it) -> list[tuple[np.ndarray, np.ndarray]]:
    it.reset()  # the train script's pattern: reset, then iterate
    return [_rows(b) for b in it]


def _assert_same(got, expected, *, images: bool = True) -> None:
    assert len(got) == len(expected)
    for i, ((gi, gl), (ei, el)) in enumerate(zip(got, expected)):
        assert np.array_equal(gl, el), f"batch {i}: labels {gl.tolist()} != {el.tolist()}"
        if images:
            assert np.array_equal(gi, ei), f"batch {i}: images differ (max |diff| {np.abs(gi - ei).max()})"


def _interrupted(it, cut: int) -> dict:
    """Read ``cut`` batches of the first epoch, then save the state through JSON (as a checkpoint file would)."""
    for i, _ in enumerate(it):
        if i + 1 == cut:
            break
    return json.loads(json.dumps(it.state_dict()))


@pytest.mark.parametrize(("train", "shards", "cut"), [(True, 1, 3), (True, 2, 2), (False, 1, 4)],
                         ids=["train", "train-2-shards-drop", "val"])
def test_dali_mid_epoch_resume_is_bit_identical(indexed_val_source, train, shards, cut):
    def make():
        return create_classification_loader(indexed_val_source, train=train, batch_size=8, crop_size=CROP, workers=1,
                                            dist=DistInfo(shards - 1, shards, 0, "test"), checkpointing=True)

    reference = make()
    epochs = [_epoch(reference) for _ in range(2)]
    state = _interrupted(make(), cut)
    assert state["epoch"] == 0 and state["batches"] == cut and not state["ended"] and state["dali"]

    resumed = make()  # a new process would build the loader the same way, then restore
    resumed.load_state_dict(state)
    _assert_same(_epoch(resumed), epochs[0][cut:])  # the rest of the interrupted epoch, bit for bit
    _assert_same(_epoch(resumed), epochs[1])  # and the next epoch: same shuffle, same random crops
    assert resumed.epoch == 2


def test_dali_resume_from_an_epoch_end_starts_the_next_epoch(indexed_val_source):
    def make():
        return create_classification_loader(indexed_val_source, train=True, batch_size=8, crop_size=CROP, workers=1,
                                            checkpointing=True)

    reference = make()
    epochs = [_epoch(reference) for _ in range(2)]
    it = make()
    assert len(_epoch(it)) == 7
    state = json.loads(json.dumps(it.state_dict()))
    assert state["epoch"] == 1 and state["ended"]
    resumed = make()
    resumed.load_state_dict(state)
    _assert_same(_epoch(resumed), epochs[1])


def test_checkpointing_does_not_change_the_data(indexed_val_source):
    plain, checkpointed = (create_classification_loader(indexed_val_source, train=True, batch_size=8, crop_size=CROP,
                                                        workers=1, checkpointing=c) for c in (False, True))
    _assert_same(_epoch(checkpointed), _epoch(plain))


@pytest.mark.parametrize("train", [True, False], ids=["train", "val"])
def test_native_resume_restores_the_order(tiny_classification, train):
    source = resolve_source(tiny_classification / "recordio", "val")

    def make():
        return create_classification_loader(source, train=train, backend="native", batch_size=8, crop_size=CROP,
                                            workers=1)

    reference = make()
    epochs = [_epoch(reference) for _ in range(3)]
    first = make()
    _epoch(first)  # one whole epoch, so the restore must replay a reshuffle as well
    state = _interrupted(first, 3)
    assert state == {"epoch": 1, "batches": 3, "ended": False}
    resumed = make()
    resumed.load_state_dict(state)
    # the order is restored; ImageRecordIter's random crops are not (its generators cannot be saved)
    _assert_same(_epoch(resumed), epochs[1][3:], images=not train)
    _assert_same(_epoch(resumed), epochs[2], images=not train)


def test_synthetic_resume_keeps_the_epoch_length(tiny_classification):
    it = create_classification_loader(tiny_classification / "imagefolder", train=False, backend="synthetic",
                                      batch_size=8, crop_size=CROP)
    state = _interrupted(it, 2)
    resumed = create_classification_loader(tiny_classification / "imagefolder", train=False, backend="synthetic",
                                           batch_size=8, crop_size=CROP)
    resumed.load_state_dict(state)
    assert len(_epoch(resumed)) == len(it) - 2 and len(_epoch(resumed)) == len(it) and resumed.epoch == 2


@pytest.mark.parametrize("backend", ["dali-cpu", "native", "synthetic"])
def test_every_backend_is_a_loader(tiny_classification, backend):
    data = tiny_classification / ("recordio" if backend == "native" else "imagefolder")
    it = create_classification_loader(data, train=False, backend=backend, batch_size=8, crop_size=CROP, workers=1)
    assert isinstance(it, Loader) and it.batch_size == 8
    assert it.num_classes == (0 if backend == "native" else 11)  # RecordIO does not record the classes
    state = it.state_dict()
    assert {k: state[k] for k in ("epoch", "batches", "ended")} == {"epoch": 0, "batches": 0, "ended": False}
    assert ("dali" in state) == (backend == "dali-cpu")  # DALI loaders checkpoint by default


def test_state_errors_name_the_fix(indexed_val_source, tiny_classification, caplog):
    saved = _interrupted(create_classification_loader(indexed_val_source, train=True, batch_size=8, crop_size=CROP,
                                                      workers=1, checkpointing=True), 2)
    plain = create_classification_loader(indexed_val_source, train=True, batch_size=8, crop_size=CROP, workers=1,
                                         checkpointing=False)
    with pytest.raises(ValueError, match="pass checkpointing=True"):
        plain.load_state_dict(saved)
    with pytest.raises(ValueError, match=r"lacks \['batches', 'ended'\]"):
        plain.load_state_dict({"epoch": 1})
    with caplog.at_level(logging.WARNING, logger="crossdali.mxnet.loaders"):
        plain.load_state_dict({"epoch": 3, "batches": 2, "ended": False})  # no DALI checkpoint: a fresh epoch
    assert "without a DALI checkpoint" in caplog.text and plain.epoch == 3 and len(_epoch(plain)) == 7

    native = create_classification_loader(tiny_classification / "recordio", train=False, backend="native",
                                          batch_size=8, crop_size=CROP, workers=1)
    native.next()
    with pytest.raises(ValueError, match="call it before reading any batch"):
        native.load_state_dict({"epoch": 0, "batches": 1, "ended": False})
