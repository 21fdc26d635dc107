"""``create_external_source_loader`` on real JPEG bytes (CPU): the loader contract, the epoch rule
across shards, DALI's Python workers, mid-epoch resume, bad samples, and the Squirrel example."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from crossdali.common.distributed import DistInfo  # noqa: E402
from crossdali.common.errors import DataError  # noqa: E402
from crossdali.common.loading.loaders import Loader  # noqa: E402
from crossdali.pytorch import create_classification_loader  # noqa: E402
from crossdali.pytorch.external import ExternalSourceOptions, create_external_source_loader  # noqa: E402

CROP = 32



def _loader(source, **kw):
    kw = {"train": True, "batch_size": 8, "crop_size": CROP, "workers": 2, "num_classes": 55, **kw}
    return create_external_source_loader(source, **kw)


def _epoch(loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return list(loader)


def _ids(batches) -> list[int]:
    return [i for _, labels in batches for i in labels.tolist()]


def test_loader_contract_and_val_equals_the_file_reader(val_items, indexed_val_source):
    loader = _loader(val_items, train=False)
    assert isinstance(loader, Loader) and loader.batch_size == 8 and loader.num_classes == 55 and len(loader) == 7
    batches = _epoch(loader)
    assert [b[0].shape for b in batches] == [(8, 3, CROP, CROP)] * 6 + [(7, 3, CROP, CROP)]
    assert batches[0][0].dtype == torch.float32 and batches[0][1].dtype == torch.int64
    reference = list(create_classification_loader(indexed_val_source, train=False, batch_size=8, crop_size=CROP,
                                                  workers=2))
    for (a, la), (b, lb) in zip(batches, reference, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)  # the same bytes, the same transform: the same bits
    assert loader.epoch == 1 and _ids(_epoch(loader)) == list(range(55))  # the next for is the next epoch


def test_channels_last_is_the_same_batch_in_the_model_layout(val_items):
    """``channels_last``: DALI writes NHWC and the batch is its NCHW view, the padded last batch
    trimmed alike."""
    plain, fast = _epoch(_loader(val_items, train=False)), _epoch(_loader(val_items, train=False, channels_last=True))
    assert [b[0].shape for b in fast] == [b[0].shape for b in plain]
    for (a, la), (b, lb) in zip(plain, fast, strict=True):
        assert b.is_contiguous(memory_format=torch.channels_last) and not b.is_contiguous()
        assert torch.equal(a, b) and torch.equal(la, lb)


@pytest.mark.parametrize("world", [2, 3])
def test_val_shards_see_every_sample_once(val_items, world, assert_epoch_coverage):
    seen = [_ids(_epoch(_loader(val_items, train=False, dist=DistInfo(rank=r, world_size=world))))
            for r in range(world)]
    assert_epoch_coverage(seen, 55)


def test_train_one_process_every_sample_once_per_epoch_in_new_order(val_items, assert_epoch_coverage):
    loader = _loader(val_items, seed=5)
    first, second = _ids(_epoch(loader)), _ids(_epoch(loader))
    assert_epoch_coverage([first], 55)
    assert_epoch_coverage([second], 55)
    assert first != second
    again = _ids(_epoch(_loader(val_items, seed=5)))
    assert again == first  # the seed fixes the order


def test_train_two_ranks_drop_to_equal_steps(val_items):
    loaders = [_loader(val_items, dist=DistInfo(rank=r, world_size=2)) for r in range(2)]
    epochs = [_epoch(loader) for loader in loaders]
    assert [len(e) for e in epochs] == [3, 3] == [len(loader) for loader in loaders]  # 55 // 2 = 27 -> 3 x 8
    a, b = (_ids(e) for e in epochs)
    assert len(a) == len(b) == 24 and not set(a) & set(b)
    images = [e[0][0] for e in epochs]
    assert not torch.equal(images[0][:1], images[1][:1])  # shards augment differently


def test_parallel_workers_give_the_same_batches(val_items):
    """DALI's worker processes only read bytes; the augmentation's randomness stays in DALI."""
    serial = _epoch(_loader(val_items, seed=2))
    parallel = _epoch(_loader(val_items, seed=2, feed=ExternalSourceOptions(parallel=True, py_workers=2)))
    for (a, la), (b, lb) in zip(serial, parallel, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)


@pytest.mark.parametrize("kind", ["indexed", "stream"])
def test_mid_epoch_resume_continues_with_the_same_batches(val_items, kind):
    source = val_items if kind == "indexed" else (lambda: iter(val_items))
    make = dict(seed=4, checkpointing=True)  # train: random crops and flips, whose state DALI's checkpoint holds
    loader = _loader(source, **make)
    _epoch(loader)  # one whole epoch first: the resume is inside epoch 2
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = loader.state_dict()
    rest = list(it)
    assert state["epoch"] == 1 and state["batches"] == 3 and "dali" in state

    restored = _loader(source, **make)
    restored.load_state_dict(json.loads(json.dumps(state)))  # plain JSON-able values, as the contract says
    resumed = _epoch(restored)
    assert len(head) + len(resumed) == 7
    for (a, la), (b, lb) in zip(rest, resumed, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)
    assert restored.epoch == 2 and sorted(_ids(head) + _ids(resumed)) == list(range(55))


def test_unsized_stream_has_no_len_until_told(val_items):
    with pytest.raises(TypeError, match="pass num_samples="):
        len(_loader(lambda: iter(val_items), train=False))
    assert len(_loader(lambda: iter(val_items), train=False, num_samples=55)) == 7


def test_gif_in_the_source_is_refused_with_its_index(val_items):
    items = list(val_items)
    items[13] = (b"GIF89a" + items[13][0][6:], 13)
    with pytest.raises(DataError, match="sample 13 of .* is a GIF file"):
        _epoch(_loader(items, train=False))
    with pytest.raises(Exception, match="sample 13 of .* is a GIF file"):  # raised in a DALI worker process
        _epoch(_loader(items, train=False, feed=ExternalSourceOptions(parallel=True, py_workers=2)))


def test_corrupt_jpeg_names_the_source(val_items):
    items = list(val_items)
    items[3] = (items[3][0][:200], 3)  # a JPEG header, then nothing
    with pytest.raises(DataError, match="from my-source cannot be decoded"):
        _epoch(_loader(items, train=False, name="my-source"))


def test_squirrel_store_through_dali_workers(tiny_classification, tmp_path, assert_epoch_coverage):
    pytest.importorskip("squirrel")
    from crossdali.common.data.sources import resolve_source
    from crossdali.common.squirrel import SquirrelSource, write_squirrel_store

    val = resolve_source(tiny_classification / "imagefolder", "val")
    assert write_squirrel_store(val, tmp_path / "store", samples_per_shard=8) == 55
    source = SquirrelSource(tmp_path / "store", num_classes=val.num_classes)
    assert source.shard_sizes == (8,) * 6 + (7,)  # counted once, then read per batch by DALI's workers
    reference = list(create_classification_loader(val, train=False, batch_size=8, crop_size=CROP, workers=2))
    # spawn: the start method a CUDA process needs, so the source must pickle
    loader = create_external_source_loader(source, train=False, batch_size=8, crop_size=CROP, workers=2,
                                           feed=ExternalSourceOptions(parallel=True, py_start_method="spawn"))
    assert loader.num_classes == 11
    for (a, la), (b, lb) in zip(loader, reference, strict=True):  # store order = file order
        assert torch.equal(a, b) and torch.equal(la, lb)
    # two ranks: each reads its own store shards (every second one); together every sample once
    index = {Path(f).read_bytes(): i for i, f in enumerate(val.files)}
    seen = []
    for rank in range(2):
        part = source.shard(rank, 2)
        seen.append([index[jpeg] for jpeg, _ in part])
        loader = create_external_source_loader(source, train=False, batch_size=8, crop_size=CROP, workers=2,
                                               dist=DistInfo(rank=rank, world_size=2))
        assert sum(len(labels) for _, labels in loader) == len(seen[-1])
    assert_epoch_coverage(seen, 55)


class _Shelves:
    """A sharded source in memory (``shard_sizes`` + ``read_shard``): the val items cut into shards of
    uneven sizes, so batches straddle shards. Counts its shard reads; picklable for spawned workers."""

    def __init__(self, items, sizes) -> None:
        assert sum(sizes) == len(items)
        self.shard_sizes, self.num_classes, self.reads = tuple(sizes), 55, 0
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        self.shards = [items[s:s + n] for s, n in zip(starts, sizes)]

    def read_shard(self, i):
        self.reads += 1
        return self.shards[i]


SIZES = (9, 4, 13, 7, 8, 1, 13)  # 55 samples in 7 shards


def test_sharded_source_epochs_shards_workers_and_resume(val_items, assert_epoch_coverage):
    source = _Shelves(val_items, SIZES)
    val = _loader(source, train=False)
    assert len(val) == 7 and _ids(_epoch(val)) == list(range(55))  # val: store order, every sample once
    # two ranks hold shards 0,2,4,6 (43 samples) and 1,3,5 (12): val keeps them all ...
    parts = [_loader(source, train=False, dist=DistInfo(rank=r, world_size=2)) for r in range(2)]
    assert [len(p) for p in parts] == [6, 2]
    assert_epoch_coverage([_ids(_epoch(p)) for p in parts], 55)
    # ... training takes the whole batches the smaller rank fills (DROP: one step of 8 on each rank)
    parts = [_loader(source, dist=DistInfo(rank=r, world_size=2)) for r in range(2)]
    assert [len(p) for p in parts] == [1, 1] and [len(_ids(_epoch(p))) for p in parts] == [8, 8]

    train = _loader(source, seed=3)
    first, second = _ids(_epoch(train)), _ids(_epoch(train))
    assert_epoch_coverage([first], 55)
    assert_epoch_coverage([second], 55)
    assert first != second  # shard order and order inside the shards reshuffled every epoch
    # a pure function of (epoch, batch): DALI's worker processes build the very same batches
    serial = _epoch(_loader(source, seed=3))
    parallel = _epoch(_loader(source, seed=3, feed=ExternalSourceOptions(parallel=True, py_workers=3)))
    assert _ids(serial) == first
    for (a, la), (b, lb) in zip(serial, parallel, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)

    loader = _loader(source, seed=3, checkpointing=True)
    _epoch(loader)  # the resume is inside epoch 2
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = loader.state_dict()
    rest = list(it)
    restored = _loader(source, seed=3, checkpointing=True)
    restored.load_state_dict(json.loads(json.dumps(state)))
    resumed = list(restored)
    assert _ids(head + resumed) == second
    for (a, la), (b, lb) in zip(rest, resumed, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_sharded_source_errors_name_the_shard(val_items):
    items = list(val_items)
    items[20] = (b"GIF89a" + items[20][0][6:], 20)
    with pytest.raises(DataError, match=r"sample 7 of shard 2 of .* is a GIF file"):
        _epoch(_loader(_Shelves(items, SIZES), train=False))  # item 20 = shard 2 (from 13), position 7
    source = _Shelves(val_items, SIZES)
    loader = _loader(source, train=False)
    source.shards[1] = source.shards[1][:3]  # the store changed under the loader
    with pytest.raises(DataError, match="shard 1 of .* holds 3 samples, not the 4 counted"):
        _epoch(loader)
    with pytest.raises(ValueError, match="7 shards, fewer than the 8 ranks"):
        _loader(source, dist=DistInfo(rank=0, world_size=8))
    with pytest.raises(ValueError, match="batched=True is for streams"):
        _loader(source, feed=ExternalSourceOptions(batched=True))
