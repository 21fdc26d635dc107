"""``crossdali.mxnet.create_external_source_loader`` / ``create_multilabel_loader`` on real JPEG bytes
(CPU): the same pixels as the MXNet file-reader iterator, MXNet's padded last batch, every sample
once per epoch across shards, mid-epoch reset and resume, multi-hot labels, errors that name the
sample."""

from __future__ import annotations

import json

import numpy as np
import pytest

mx = pytest.importorskip("mxnet")

from crossdali.common.distributed import DistInfo  # noqa: E402
from crossdali.common.errors import DataError  # noqa: E402
from crossdali.common.loading.loaders import Loader  # noqa: E402
from crossdali.mxnet import (  # noqa: E402
    ExternalSourceOptions,
    create_classification_loader,
    create_external_source_loader,
    create_multilabel_loader,
)

pytestmark = pytest.mark.mxnet

CROP = 32



def _loader(source, **kw):
    kw = {"train": True, "batch_size": 8, "crop_size": CROP, "workers": 2, "num_classes": 55, **kw}
    return create_external_source_loader(source, **kw)


def _rows(batch) -> tuple[np.ndarray, np.ndarray]:
    n = batch.data[0].shape[0] - batch.pad
    return batch.data[0].asnumpy()[:n], batch.label[0].asnumpy()[:n]


def _ids(batches) -> list[int]:
    return [int(i) for b in batches for i in _rows(b)[1]]


def _drain(it) -> list:
    """The rest of the current epoch by next() (``iter()`` on an iterator read mid-epoch starts the next one)."""
    out = []
    while True:
        try:
            out.append(it.next())
        except StopIteration:
            return out


def _same(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(_rows(a), _rows(b), strict=True)) and a.pad == b.pad


def test_val_equals_the_file_reader_iterator_with_mxnets_padding(val_items, indexed_val_source):
    it = _loader(val_items, train=False)
    assert isinstance(it, mx.io.DataIter) and isinstance(it, Loader)
    assert len(it) == 7 and it.num_classes == 55 and it.num_samples == 55
    assert it.provide_data[0].shape == (8, 3, CROP, CROP) and it.provide_label[0].shape == (8,)
    batches = list(it)
    assert all(b.data[0].shape == (8, 3, CROP, CROP) and b.label[0].dtype == np.float32 for b in batches)
    assert [b.pad for b in batches] == [0] * 6 + [1]
    last = batches[-1]  # the padding row repeats the last real one, as DALI's readers pad
    assert np.array_equal(last.data[0].asnumpy()[7], last.data[0].asnumpy()[6])
    reference = list(create_classification_loader(indexed_val_source, train=False, batch_size=8, crop_size=CROP,
                                                  workers=2))
    for got, want in zip(batches, reference, strict=True):
        assert _same(got, want)  # the same bytes, the same transform: the same bits
    assert it.epoch == 1 and _ids(list(it)) == list(range(55))  # iter() again: the next epoch


@pytest.mark.parametrize("world", [2, 3])
def test_val_shards_see_every_sample_once(val_items, world, assert_epoch_coverage):
    seen = [_ids(list(_loader(val_items, train=False, dist=DistInfo(rank=r, world_size=world)))) for r in range(world)]
    assert_epoch_coverage(seen, 55)


def test_train_order_follows_the_seed_and_workers_change_nothing(val_items, assert_epoch_coverage):
    it = _loader(val_items, seed=5)
    first, second = _ids(list(it)), _ids(list(it))
    assert_epoch_coverage([first], 55)
    assert first != second and _ids(list(_loader(val_items, seed=5))) == first
    serial = list(_loader(val_items, seed=2))
    parallel = list(_loader(val_items, seed=2, feed=ExternalSourceOptions(parallel=True, py_workers=2)))
    for a, b in zip(serial, parallel, strict=True):
        assert _same(a, b)


def test_mid_epoch_reset_starts_the_next_epoch(val_items, assert_epoch_coverage):
    it = _loader(val_items, seed=3)
    it.reset()  # nothing read yet: no epoch is skipped
    head = [it.next() for _ in range(2)]
    it.reset()  # Module.fit(epoch_size=2): the rest of epoch 1 is read and discarded
    assert it.epoch == 1 and len(head) == 2
    assert_epoch_coverage([_ids(list(it))], 55)  # epoch 2 is whole
    assert it.epoch == 2


@pytest.mark.parametrize("kind", ["indexed", "stream"])
def test_mid_epoch_resume_continues_with_the_same_batches(val_items, kind):
    source = val_items if kind == "indexed" else (lambda: iter(val_items))
    it = _loader(source, seed=4, checkpointing=True)
    list(it)  # the resume is inside epoch 2
    it.reset()
    head = [it.next() for _ in range(3)]
    state = it.state_dict()
    rest = _drain(it)
    restored = _loader(source, seed=4, checkpointing=True)
    restored.load_state_dict(json.loads(json.dumps(state)))
    resumed = list(restored)  # a restored iterator continues the saved epoch
    assert len(resumed) == len(rest) > 0
    for a, b in zip(rest, resumed, strict=True):
        assert _same(a, b)
    assert restored.epoch == 2 and sorted(_ids(head) + _ids(resumed)) == list(range(55))
    with pytest.raises(ValueError, match="lacks 'loader'"):
        restored.load_state_dict({"epoch": 1, "batches": 0, "ended": False})


def test_multi_label_gives_multi_hot_rows(val_items):
    items = [(jpeg, [i % 5, (i * 3) % 7]) for jpeg, i in val_items]
    it = _loader(items, train=False, num_classes=7, multi_label=True)
    assert it.provide_label[0].shape == (8, 7)
    labels = np.concatenate([_rows(b)[1] for b in it])
    assert labels.shape == (55, 7) and labels.dtype == np.float32
    expected = np.zeros((55, 7), np.float32)
    for i in range(55):
        expected[i, [i % 5, (i * 3) % 7]] = 1
    assert np.array_equal(labels, expected)


def test_multilabel_list_loader_reads_the_sample_set(data_root):
    from crossdali.common.data.sample_data import ensure_multilabel
    from crossdali.common.multilabel import read_multilabel_list

    root = ensure_multilabel(data_root, "tiny")
    want = read_multilabel_list(root / "val.txt").label_matrix()
    it = create_multilabel_loader(root, train=False, batch_size=16, crop_size=CROP, workers=2, py_workers=0)
    labels = np.concatenate([_rows(b)[1] for b in it])
    assert np.array_equal(labels, want)  # val in list order, every image once
    assert 1 <= want.sum(axis=1).min() and want.sum(axis=1).max() <= 3


def test_bad_samples_are_named(val_items):
    items = list(val_items)
    items[13] = (b"GIF89a" + items[13][0][6:], 13)
    with pytest.raises(DataError, match="sample 13 of .* is a GIF file"):
        list(_loader(items, train=False))
    items = list(val_items)
    items[3] = (items[3][0][:200], 3)
    with pytest.raises(DataError, match="from my-source cannot be decoded"):
        list(_loader(items, train=False, name="my-source"))
    with pytest.raises(RuntimeError, match="dali-gpu needs MXNet built with CUDA"):
        _loader(val_items, backend="dali-gpu")
