"""The seed decides the training order, the same way in every framework (reliability issue: the
order used to ignore the seed): same seed, same order; other seed, other order; over two shards
every sample exactly once per epoch. Labels are the sample indices, so they name the samples."""

from __future__ import annotations

import numpy as np
import pytest

from crossdali.common.distributed import DistInfo

FRAMEWORKS = {"pytorch": "torch", "tensorflow": "tensorflow", "mxnet": "mxnet", "jax": "jax"}


def _labels(framework: str, source, *, seed: int, epochs: int = 2, dist: DistInfo | None = None,
            last_batch: str = "partial", batch_size: int = 16) -> list[list[int]]:
    """Sample indices seen in each of ``epochs`` epochs of the dali-cpu train loader of ``framework``."""
    module = pytest.importorskip(f"crossdali.{framework}")
    kwargs = dict(train=True, backend="dali-cpu", batch_size=batch_size, crop_size=32, workers=2, seed=seed, dist=dist,
                  last_batch=last_batch)
    if framework in ("tensorflow", "jax"):
        kwargs["layout"] = "HWC"
    loader = module.create_classification_loader(source, **kwargs)
    out = []
    for _ in range(epochs):
        if framework == "mxnet":  # MXNet's convention: full batches, `pad` trailing rows of padding
            seen = [b.label[0].asnumpy()[: b.data[0].shape[0] - b.pad] for b in loader]
        else:
            seen = [np.asarray(labels) for _, labels in loader]
        out.append([int(x) for batch in seen for x in batch.ravel()])
    return out


@pytest.fixture(scope="module")
def indexed_train_source(tiny_classification):
    """The tiny train split (264 samples) with each label replaced by the sample's index."""
    from crossdali.common.data.sources import DataSource, scan_image_folder

    src = scan_image_folder(tiny_classification / "imagefolder" / "train")
    return DataSource(format="filelist", root=src.root, files=src.files, labels=tuple(range(src.num_samples)),
                      num_samples=src.num_samples)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_seed_decides_the_order(framework, indexed_train_source):
    pytest.importorskip(FRAMEWORKS[framework])
    n = indexed_train_source.num_samples
    a, b, c = (_labels(framework, indexed_train_source, seed=s) for s in (3, 3, 4))
    assert a == b  # same seed: the same order, epoch after epoch
    assert a[0] != c[0] and a[1] != c[1]  # another seed: another order in every epoch
    assert a[0] != a[1]  # reshuffled every epoch
    for epoch in a + c:
        assert sorted(epoch) == list(range(n))  # every sample once per epoch


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_two_shards_see_every_sample_once_per_epoch(framework, indexed_train_source, assert_epoch_coverage):
    pytest.importorskip(FRAMEWORKS[framework])
    shards = [_labels(framework, indexed_train_source, seed=5, dist=DistInfo(rank=r, world_size=2)) for r in (0, 1)]
    for epoch in range(2):
        assert_epoch_coverage([shard[epoch] for shard in shards], indexed_train_source.num_samples)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_drop_leaves_samples_out_but_never_repeats_one(framework, indexed_train_source):
    """DROP over 2 ranks with 41 samples and batch 4 (20 per rank, a multiple of the batch, shards of
    20 and 21): DALI's own DROP left the padded last batch in the pipeline, so from the second epoch
    every rank began with one sample four times and later samples shifted (PyTorch, JAX and MXNet;
    TensorFlow counted its own epochs). Every epoch: 5 full batches per rank, 40 different samples."""
    pytest.importorskip(FRAMEWORKS[framework])
    from crossdali.common.data.sources import DataSource

    n = 41
    src = DataSource(format="filelist", root=indexed_train_source.root, files=indexed_train_source.files[:n],
                     labels=tuple(range(n)), num_samples=n)
    shards = [_labels(framework, src, seed=5, epochs=3, dist=DistInfo(rank=r, world_size=2), last_batch="drop",
                      batch_size=4) for r in (0, 1)]
    for epoch in range(3):
        seen = shards[0][epoch] + shards[1][epoch]
        assert [len(shard[epoch]) for shard in shards] == [20, 20], epoch
        assert len(set(seen)) == 40 and set(seen) <= set(range(n)), (epoch, sorted(seen))


def test_drop_state_from_before_the_fix_is_not_restored(indexed_train_source, caplog, monkeypatch):
    """A DROP state saved before the fix (no ``batches``; DALI's iterator ran DROP, so its checkpoint
    carries DROP's epoch size): restored, it would repeat samples in every later epoch, so the epoch
    restarts instead, with a warning. The old loader is this one with DALI's own DROP put back."""
    pytest.importorskip("torch")
    import crossdali.pytorch as module
    from crossdali.common.data.sources import DataSource
    from crossdali.common.loading.dali_loader import DALIIteratorLoader

    n = 41
    src = DataSource(format="filelist", root=indexed_train_source.root, files=indexed_train_source.files[:n],
                     labels=tuple(range(n)), num_samples=n)
    kw = dict(train=True, backend="dali-cpu", batch_size=4, crop_size=32, workers=1, last_batch="drop")

    def loaders():
        return [module.create_classification_loader(src, dist=DistInfo(rank=r, world_size=2), **kw) for r in (0, 1)]

    with monkeypatch.context() as m:
        m.setattr(DALIIteratorLoader, "_iterator_policy", property(lambda self: self.policy))
        states = []
        for loader in loaders():
            it = iter(loader)
            next(it), next(it)
            state = loader.state_dict()
            del state["batches"]  # the old format
            states.append(state)
    resumed = loaders()
    with caplog.at_level("WARNING"):
        for loader, state in zip(resumed, states, strict=True):
            loader.load_state_dict(state)
    for _ in range(3):
        seen = [int(x) for loader in resumed for _, labels in loader for x in np.asarray(labels).ravel()]
        assert len(seen) == len(set(seen)) == 40
    assert "older than its DROP fix" in caplog.text
