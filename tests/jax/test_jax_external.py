"""``crossdali.jax.create_external_source_loader`` on real JPEG bytes (CPU): the same pixels as the
file reader, jax.Array batches, every sample once per epoch across shards (the padding DALI's JAX
iterator cannot cut is trimmed by the shared loader half), mid-epoch resume, multi-label, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("nvidia.dali.plugin.jax")

from crossdali.common.distributed import DistInfo  # noqa: E402
from crossdali.common.errors import DataError  # noqa: E402
from crossdali.common.loading.loaders import Loader  # noqa: E402
from crossdali.jax import create_classification_loader  # noqa: E402
from crossdali.jax.external import ExternalSourceOptions, create_external_source_loader  # noqa: E402

pytestmark = pytest.mark.jax

CROP = 32



def _loader(source, **kw):
    kw = {"train": True, "batch_size": 8, "crop_size": CROP, "workers": 2, "num_classes": 55, **kw}
    return create_external_source_loader(source, **kw)


def _ids(batches) -> list[int]:
    return [int(i) for _, labels in batches for i in np.asarray(labels)]


def _same(a, b) -> bool:
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b, strict=True))


def test_val_equals_the_file_reader_in_jax_arrays(val_items, indexed_val_source):
    loader = _loader(val_items, train=False)
    assert isinstance(loader, Loader) and len(loader) == 7 and loader.num_classes == 55
    batches = list(loader)
    assert [b[0].shape for b in batches] == [(8, CROP, CROP, 3)] * 6 + [(7, CROP, CROP, 3)]
    images, labels = batches[0]
    assert isinstance(images, jax.Array) and images.dtype == jax.numpy.float32 and labels.dtype == jax.numpy.int32
    reference = list(create_classification_loader(indexed_val_source, train=False, batch_size=8, crop_size=CROP,
                                                  workers=2))
    for got, want in zip(batches, reference, strict=True):
        assert _same(got, want)  # the same bytes, the same transform: the same bits
    assert loader.epoch == 1 and _ids(list(loader)) == list(range(55))


@pytest.mark.parametrize("world", [2, 3])
def test_val_shards_see_every_sample_once(val_items, world, assert_epoch_coverage):
    seen = [_ids(list(_loader(val_items, train=False, dist=DistInfo(rank=r, world_size=world)))) for r in range(world)]
    assert_epoch_coverage(seen, 55)


def test_train_order_follows_the_seed_and_workers_change_nothing(val_items, assert_epoch_coverage):
    loader = _loader(val_items, seed=5)
    first, second = _ids(list(loader)), _ids(list(loader))
    assert_epoch_coverage([first], 55)
    assert first != second and _ids(list(_loader(val_items, seed=5))) == first
    serial = list(_loader(val_items, seed=2))
    parallel = list(_loader(val_items, seed=2, feed=ExternalSourceOptions(parallel=True, py_workers=2)))
    for a, b in zip(serial, parallel, strict=True):
        assert _same(a, b)


@pytest.mark.parametrize("kind", ["indexed", "stream"])
def test_mid_epoch_resume_continues_with_the_same_batches(val_items, kind):
    source = val_items if kind == "indexed" else (lambda: iter(val_items))
    loader = _loader(source, seed=4, checkpointing=True)
    list(loader)  # the resume is inside epoch 2
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = loader.state_dict()
    rest = list(it)
    restored = _loader(source, seed=4, checkpointing=True)
    restored.load_state_dict(json.loads(json.dumps(state)))
    resumed = list(restored)
    for a, b in zip(rest, resumed, strict=True):
        assert _same(a, b)
    assert restored.epoch == 2 and sorted(_ids(head) + _ids(resumed)) == list(range(55))


def test_multi_label_gives_multi_hot_rows(val_items):
    items = [(jpeg, [i % 5, (i * 3) % 7]) for jpeg, i in val_items]
    batches = list(_loader(items, train=False, num_classes=7, multi_label=True))
    labels = np.concatenate([np.asarray(lab) for _, lab in batches])
    assert labels.shape == (55, 7) and labels.dtype == np.float32
    expected = np.zeros((55, 7), np.float32)
    for i in range(55):
        expected[i, [i % 5, (i * 3) % 7]] = 1
    assert np.array_equal(labels, expected)


def test_bad_samples_are_named(val_items):
    items = list(val_items)
    items[13] = (b"GIF89a" + items[13][0][6:], 13)
    with pytest.raises(DataError, match="sample 13 of .* is a GIF file"):
        list(_loader(items, train=False))
    items = list(val_items)
    items[3] = (items[3][0][:200], 3)
    with pytest.raises(DataError, match="from my-source cannot be decoded"):
        list(_loader(items, train=False, name="my-source"))
