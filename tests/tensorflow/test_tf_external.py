"""``crossdali.tensorflow.create_external_source_loader`` / ``create_multilabel_loader`` on real JPEG
bytes (CPU): through DALI's TensorFlow plugin (the source as one packed input), the same pixels as
the TF file-reader loader and as PyTorch's external-source loader's order, every sample once per
epoch across shards, reshuffled training epochs, sharded sources, multi-hot labels, named errors."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("nvidia.dali.plugin.tf")

from crossdali.common.distributed import DistInfo  # noqa: E402
from crossdali.common.errors import DataError  # noqa: E402
from crossdali.common.loading.loaders import Loader  # noqa: E402
from crossdali.tensorflow import create_classification_loader  # noqa: E402
from crossdali.tensorflow.external import create_external_source_loader, create_multilabel_loader  # noqa: E402

pytestmark = pytest.mark.tensorflow

CROP = 32



def _loader(source, **kw):
    kw = {"train": True, "batch_size": 8, "crop_size": CROP, "workers": 2, "num_classes": 55, **kw}
    return create_external_source_loader(source, **kw)


def _ids(batches) -> list[int]:
    return [int(i) for _, labels in batches for i in labels.numpy()]


def test_val_equals_the_tf_file_reader_loader(val_items, indexed_val_source):
    loader = _loader(val_items, train=False)
    assert isinstance(loader, Loader) and len(loader) == 7 and loader.num_classes == 55
    batches = list(loader)
    assert [tuple(b[0].shape) for b in batches] == [(8, CROP, CROP, 3)] * 6 + [(7, CROP, CROP, 3)]
    assert batches[0][0].dtype == tf.float32 and batches[0][1].dtype == tf.int64
    reference = list(create_classification_loader(indexed_val_source, train=False, batch_size=8, crop_size=CROP,
                                                  workers=2))
    for (a, la), (b, lb) in zip(batches, reference, strict=True):
        assert np.array_equal(a.numpy(), b.numpy()) and np.array_equal(la.numpy(), lb.numpy())  # the same bits
    assert loader.epoch == 1 and _ids(list(loader)) == list(range(55))  # the next for: the next epoch
    keras_view = list(loader.dataset)  # model.fit's view of val: one epoch, padding cut
    assert _ids(keras_view) == list(range(55))


@pytest.mark.parametrize("world", [2, 3])
def test_val_shards_see_every_sample_once(val_items, world, assert_epoch_coverage):
    seen = [_ids(list(_loader(val_items, train=False, dist=DistInfo(rank=r, world_size=world)))) for r in range(world)]
    assert_epoch_coverage(seen, 55)


def test_train_epochs_reshuffle_in_the_other_frameworks_order(val_items, assert_epoch_coverage):
    loader = _loader(val_items, seed=5)
    first, second = _ids(list(loader)), _ids(list(loader))
    assert_epoch_coverage([first], 55)
    assert_epoch_coverage([second], 55)
    assert first != second and _ids(list(_loader(val_items, seed=5))) == first
    # the permutation every framework's external-source loader takes (crossdali.common.loading.external_readers.IndexedSamples)
    assert [first, second] == [np.random.default_rng([5, e]).permutation(55).tolist() for e in (0, 1)]


def test_restored_loader_continues_at_its_epoch_in_that_epochs_order(val_items):
    loader = _loader(val_items, seed=2)
    epochs = [_ids(list(loader)) for _ in range(2)]
    restored = _loader(val_items, seed=2)
    restored.load_state_dict({"epoch": 1})
    assert restored.epoch == 1 and _ids(list(restored)) == epochs[1]


def test_sharded_source_and_multi_hot_labels(val_items, data_root):
    class Shelves:  # a sharded source in memory: uneven shards
        num_classes, shard_sizes = 55, (20, 13, 22)

        def read_shard(self, i):
            start = sum(self.shard_sizes[:i])
            return val_items[start:start + self.shard_sizes[i]]

    assert _ids(list(_loader(Shelves(), train=False))) == list(range(55))
    parts = [_ids(list(_loader(Shelves(), train=False, dist=DistInfo(rank=r, world_size=2)))) for r in range(2)]
    assert parts == [list(range(20)) + list(range(33, 55)), list(range(20, 33))]

    from crossdali.common.data.sample_data import ensure_multilabel
    from crossdali.common.multilabel import read_multilabel_list

    root = ensure_multilabel(data_root, "tiny")
    loader = create_multilabel_loader(root, train=False, batch_size=16, crop_size=CROP, workers=2)
    labels = np.concatenate([y.numpy() for _, y in loader])
    assert labels.dtype == np.float32 and np.array_equal(labels, read_multilabel_list(root / "val.txt").label_matrix())


def test_bad_samples_and_streams_are_refused_with_the_fix(val_items):
    items = list(val_items)
    items[13] = (b"GIF89a" + items[13][0][6:], 13)
    with pytest.raises(DataError, match="sample 13 of .* is a GIF file"):
        list(_loader(items, train=False))
    items = list(val_items)
    items[3] = (items[3][0][:200], 3)
    with pytest.raises(DataError, match="from my-source cannot be decoded"):
        list(_loader(items, train=False, name="my-source"))
    with pytest.raises(ValueError, match="is a stream; TensorFlow's DALI plugin needs the epoch laid out"):
        _loader(lambda: iter(val_items))
    with pytest.raises(ValueError, match="DALIDataset cannot restore"):
        _loader(val_items, checkpointing=True)


_EXIT_SCRIPT = """
from crossdali.common.multilabel import read_multilabel_list
from crossdali.common.data.sample_data import ensure_multilabel
from crossdali.tensorflow.external import create_multilabel_loader

source = read_multilabel_list(ensure_multilabel(size="tiny") / "val.txt")
loader = create_multilabel_loader(source, train=False, batch_size=16, crop_size=32, workers=1)
print(sum(int(x.shape[0]) for x, _ in loader), "samples")
"""


def test_a_script_ends_without_tensorflows_generator_finalizing_error(data_root):
    """A process that iterated an external-source loader and exits without closing it: the loader's
    ``from_generator`` iterator is released by crossdali's exit handler, while Python is up. Before it,
    TensorFlow printed "Error occurred when finalizing GeneratorDataset iterator" at every such exit (the
    TensorFlow script with --multi-label printed it twice)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "CROSSDALI_DATA": str(data_root), "TF_CPP_MIN_LOG_LEVEL": "0"}
    done = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "40 samples" in done.stdout
    assert "GeneratorDataset" not in done.stderr


def test_a_closed_loader_says_so_when_iterated(val_items):
    loader = _loader(val_items, train=False)
    assert len(list(loader)) == 7
    loader.close()
    with pytest.raises(RuntimeError, match=r"this loader was closed .*create a new one"):
        next(iter(loader))
