"""JAX loaders (DALI's JAX iterator on CPU pipelines): jax.Array batches, exactly-once epochs
(PARTIAL, which DALI's JAX iterator refuses, rebuilt by crossdali), mid-epoch resume, errors."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("nvidia.dali.plugin.jax")

from crossdali.common.classification import ClassificationTransform, create_classification_pipeline  # noqa: E402
from crossdali.common.data.sources import DataSource, resolve_source  # noqa: E402
from crossdali.common.distributed import DistInfo  # noqa: E402
from crossdali.common.errors import DataError  # noqa: E402
from crossdali.common.loading.loaders import Loader  # noqa: E402
from crossdali.common.options import PipelineOptions  # noqa: E402
from crossdali.jax import create_classification_loader  # noqa: E402

pytestmark = pytest.mark.jax

CROP = 48


@pytest.mark.parametrize("backend", ["dali-cpu", "synthetic"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "val"])
def test_backends_yield_jax_batches(tiny_classification, backend, train):
    loader = create_classification_loader(tiny_classification / "imagefolder", train=train, backend=backend,
                                          batch_size=16, crop_size=CROP, workers=2)
    assert isinstance(loader, Loader) and loader.num_classes == 11 and loader.batch_size == 16
    batches = list(loader)
    assert len(batches) == len(loader) == (17 if train else 4)  # 264 / 16 and 55 / 16, rounded up
    for images, labels in batches:
        assert isinstance(images, jax.Array) and images.dtype == jax.numpy.float32
        assert images.shape[1:] == (CROP, CROP, 3) and {d.platform for d in images.devices()} == {"cpu"}
        assert labels.dtype == jax.numpy.int32 and labels.shape == (images.shape[0],)
        assert 0 <= int(labels.min()) and int(labels.max()) < 11
    # the padding is cut off; synthetic batches have the same sizes (the data loaders' ceiling step for step)
    assert [len(lab) for _, lab in batches][-1] == (8 if train else 7)
    assert sum(len(lab) for _, lab in batches) == (264 if train else 55)


def test_batches_equal_the_pipeline_run_directly(tiny_classification):
    """What JAX receives is bit-identical to the framework-free pipeline's output, in both layouts."""
    src = resolve_source(tiny_classification / "imagefolder", "train")
    pipe = create_classification_pipeline(src, train=True, transform=ClassificationTransform(crop_size=32),
                                          options=PipelineOptions(batch_size=8, num_threads=2, seed=3))
    pipe.build()
    direct = [tuple(np.asarray(x.as_tensor()) for x in pipe.run()) for _ in range(2)]
    for layout in ("CHW", "HWC"):
        loader = create_classification_loader(src, train=True, batch_size=8, crop_size=32, workers=2, seed=3,
                                              layout=layout)
        for (images, labels), (want_images, want_labels) in zip(loader, direct):
            got = np.asarray(images) if layout == "CHW" else np.asarray(images).transpose(0, 3, 1, 2)
            np.testing.assert_array_equal(got, want_images)
            np.testing.assert_array_equal(np.asarray(labels), want_labels.reshape(-1))


@pytest.mark.parametrize("fmt", ["tfrecord", "recordio", "webdataset"])
def test_dali_reads_record_formats(tiny_classification, fmt):
    loader = create_classification_loader(tiny_classification / fmt, train=False, batch_size=16, crop_size=CROP,
                                          workers=2)
    labels = np.concatenate([np.asarray(lab) for _, lab in loader])
    assert labels.tolist() == list(resolve_source(tiny_classification / "imagefolder", "val").labels)


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_val_exactly_once_over_shards(indexed_val_source, assert_epoch_coverage, shards):
    seen: list[list[list[int]]] = [[], []]
    for rank in range(shards):
        loader = create_classification_loader(indexed_val_source, train=False, batch_size=8, crop_size=16,
                                              workers=1, dist=DistInfo(rank, shards, rank, "test"))
        for epoch in range(2):  # the second epoch (the reader moves on to the next shard) as well
            seen[epoch].append([int(i) for _, lab in loader for i in lab.tolist()])
    for epoch in seen:
        assert_epoch_coverage(epoch, indexed_val_source.num_samples)


def test_train_single_process_sees_every_sample_each_epoch(indexed_val_source, assert_epoch_coverage):
    loader = create_classification_loader(indexed_val_source, train=True, batch_size=8, crop_size=16, workers=1)
    epochs = [[int(i) for _, lab in loader for i in lab.tolist()] for _ in range(2)]
    for labels in epochs:
        assert_epoch_coverage([labels], indexed_val_source.num_samples)
    assert epochs[0] != epochs[1]  # reshuffled between epochs


def test_train_under_two_ranks_takes_equal_steps_and_stays_disjoint(indexed_val_source):
    per_rank = []
    for rank in range(2):
        loader = create_classification_loader(indexed_val_source, train=True, batch_size=8, crop_size=16, workers=1,
                                              dist=DistInfo(rank, 2, rank, "test"))
        batches = [lab.tolist() for _, lab in loader]
        assert len(batches) == len(loader) == 3 and all(len(b) == 8 for b in batches)  # 27 // 8 full batches
        per_rank.append({i for b in batches for i in b})
    assert not per_rank[0] & per_rank[1]


def test_fill_policy_keeps_every_batch_full(indexed_val_source):
    """``last_batch='fill'``: one shape for every batch (no second compilation); the reader's
    padding repeats the last sample, which the caller then sees twice."""
    loader = create_classification_loader(indexed_val_source, train=False, batch_size=8, crop_size=16, workers=1,
                                          last_batch="fill")
    labels = [lab.tolist() for _, lab in loader]
    assert [len(b) for b in labels] == [8] * 7
    assert labels[-1] == [48, 49, 50, 51, 52, 53, 54, 54]


def test_state_dict_resumes_mid_epoch_bit_exact(tiny_classification):
    """A loader restored from ``state_dict()`` gives exactly the batches the uninterrupted one gives
    (reader position, shuffle and augmentation state come from DALI's checkpoint)."""
    data = tiny_classification / "imagefolder"

    def make():
        return create_classification_loader(data, train=True, batch_size=32, crop_size=24, workers=2, seed=5,
                                            checkpointing=True)

    reference = make()
    first_epoch = [tuple(map(np.asarray, b)) for b in reference]
    it = iter(reference)
    wanted = [tuple(map(np.asarray, next(it))) for _ in range(5)]  # epoch 2, batches 1-5

    interrupted = make()
    for _ in interrupted:
        pass
    it = iter(interrupted)
    for _ in range(2):
        next(it)
    state = interrupted.state_dict()
    assert state["epoch"] == 1 and state["dali"]
    restored = make()
    restored.load_state_dict(state)
    assert restored.epoch == 1
    it = iter(restored)
    for want, got in zip(wanted[2:], (next(it) for _ in range(3))):
        np.testing.assert_array_equal(np.asarray(got[0]), want[0])
        np.testing.assert_array_equal(np.asarray(got[1]), want[1])
    assert not np.array_equal(first_epoch[2][0], wanted[2][0])  # a new epoch: other images


def test_state_without_checkpointing_is_a_clear_error(tiny_classification):
    data = tiny_classification / "imagefolder"
    saved = create_classification_loader(data, train=True, batch_size=32, crop_size=16, workers=1,
                                         checkpointing=True).state_dict()
    plain = create_classification_loader(data, train=True, batch_size=32, crop_size=16, workers=1, checkpointing=False)
    with pytest.raises(ValueError, match="pass checkpointing=True"):
        plain.load_state_dict(saved)


def test_unknown_backend_native_and_missing_gpu():
    with pytest.raises(ValueError, match="backend must be one of dali-gpu, dali-cpu, synthetic"):
        create_classification_loader("x", train=False, backend="dali")
    with pytest.raises(ValueError, match="no 'native' backend"):
        create_classification_loader("x", train=False, backend="native")
    if jax.default_backend() == "cpu":
        src = DataSource(format="filelist", root=None, files=("a.jpg",), labels=(0,), num_samples=1)
        with pytest.raises(RuntimeError, match="dali-gpu needs a CUDA GPU visible to JAX.*jax\\[cuda13\\]"):
            create_classification_loader(src, train=False, backend="dali-gpu")


def test_corrupt_jpeg_error_names_the_file(tmp_path, tiny_classification):
    import shutil

    for cls in ("a", "b"):
        (tmp_path / "val" / cls).mkdir(parents=True)
        for f in sorted((tiny_classification / "imagefolder" / "val" / "coffee").glob("*.jpg"))[:3]:
            shutil.copy(f, tmp_path / "val" / cls / f.name)
    bad = tmp_path / "val" / "b" / "zz_broken.jpg"
    bad.write_bytes((tmp_path / "val" / "a" / "0000.jpg").read_bytes()[:300] + bytes(range(256)) * 8)
    with pytest.raises(DataError, match="zz_broken.jpg cannot be decoded"):
        list(create_classification_loader(tmp_path, train=False, batch_size=4, crop_size=16))
