"""PyTorch loaders: every backend yields the same kind of batch; epochs are exactly-once."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from crossdali.common.data.sources import resolve_source  # noqa: E402
from crossdali.common.distributed import DistInfo  # noqa: E402
from crossdali.common.errors import DataError, UsageError  # noqa: E402
from crossdali.pytorch import create_classification_loader  # noqa: E402

CROP = 48


@pytest.mark.parametrize("backend", ["dali-cpu", "native", "synthetic"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "val"])
def test_backends_yield_torch_batches(tiny_classification, backend, train):
    loader = create_classification_loader(tiny_classification / "imagefolder", train=train, backend=backend,
                                          batch_size=16, crop_size=CROP, workers=2)
    batches = list(loader)
    assert len(batches) == len(loader) == (17 if train else 4)  # 264 / 16 and 55 / 16, rounded up
    for images, labels in batches:
        assert isinstance(images, torch.Tensor) and images.dtype == torch.float32
        assert images.shape[1:] == (3, CROP, CROP) and images.device.type == "cpu"
        assert labels.dtype == torch.int64 and labels.shape == (images.shape[0],)
        assert 0 <= int(labels.min()) and int(labels.max()) < 11
    assert sum(len(lab) for _, lab in batches) == (264 if train else 55)  # synthetic too: the same batches


@pytest.mark.parametrize(("train", "shards"), [(True, 1), (False, 3), (True, 2)], ids=["train", "val-3", "train-2"])
def test_synthetic_batches_have_the_data_loaders_sizes(indexed_val_source, train, shards):
    """Synthetic data is the ceiling of the data loaders step for step: every shard's batches have
    the sizes DALI's have (short last batch under PARTIAL, none under DROP with 2 ranks)."""
    for rank in range(shards):
        sizes = {}
        for backend in ("dali-cpu", "synthetic"):
            loader = create_classification_loader(indexed_val_source, train=train, backend=backend, batch_size=8,
                                                  crop_size=16, workers=1, dist=DistInfo(rank, shards, rank, "test"))
            sizes[backend] = [len(lab) for _, lab in loader]
        assert sizes["synthetic"] == sizes["dali-cpu"], (rank, sizes)
        assert min(sizes["dali-cpu"]) < 8 or (train and shards > 1)  # the case is there: a short batch


@pytest.mark.parametrize("fmt", ["tfrecord", "recordio", "webdataset"])
def test_dali_reads_record_formats(tiny_classification, fmt):
    loader = create_classification_loader(tiny_classification / fmt, train=False, backend="dali-cpu",
                                          batch_size=16, crop_size=CROP, workers=2)
    labels = torch.cat([lab for _, lab in loader])
    assert labels.tolist() == list(resolve_source(tiny_classification / "imagefolder", "val").labels)


@pytest.mark.parametrize("backend", ["dali-cpu", "native"])
@pytest.mark.parametrize("shards", [1, 2, 3])
def test_val_exactly_once_over_shards(indexed_val_source, assert_epoch_coverage, backend, shards):
    seen: list[list[list[int]]] = [[], []]
    for rank in range(shards):
        loader = create_classification_loader(indexed_val_source, train=False, backend=backend, batch_size=8,
                                              crop_size=16, workers=1, dist=DistInfo(rank, shards, rank, "test"))
        for epoch in range(2):  # the second epoch must be exactly-once as well
            seen[epoch].append([i for _, lab in loader for i in lab.tolist()])
    for epoch in seen:
        assert_epoch_coverage(epoch, indexed_val_source.num_samples)


def test_train_single_process_sees_every_sample_each_epoch(indexed_val_source, assert_epoch_coverage):
    loader = create_classification_loader(indexed_val_source, train=True, backend="dali-cpu", batch_size=8,
                                          crop_size=16, workers=1)
    epochs = [[i for _, lab in loader for i in lab.tolist()] for _ in range(2)]
    for labels in epochs:
        assert_epoch_coverage([labels], indexed_val_source.num_samples)
    assert epochs[0] != epochs[1]  # reshuffled between epochs


def test_train_under_two_ranks_takes_equal_steps_and_stays_disjoint(indexed_val_source):
    per_rank = []
    for rank in range(2):
        loader = create_classification_loader(indexed_val_source, train=True, backend="dali-cpu", batch_size=8,
                                              crop_size=16, workers=1, dist=DistInfo(rank, 2, rank, "test"))
        batches = [lab.tolist() for _, lab in loader]
        assert len(batches) == len(loader) == 3 and all(len(b) == 8 for b in batches)  # 27 // 8 full batches
        per_rank.append({i for b in batches for i in b})
    assert not per_rank[0] & per_rank[1]


@pytest.mark.parametrize(("pipelines", "shards"), [(2, 1), (3, 2)])
def test_pipelines_split_the_shard_and_keep_every_sample_once(indexed_val_source, assert_epoch_coverage, pipelines,
                                                              shards):
    """pipelines=: each rank's shard read by several DALI pipelines, merged into every batch."""
    seen = []
    for rank in range(shards):
        loader = create_classification_loader(indexed_val_source, train=False, backend="dali-cpu", batch_size=6,
                                              crop_size=16, workers=1, dist=DistInfo(rank, shards, rank, "test"),
                                              pipelines=pipelines)
        batches = [lab.tolist() for _, lab in loader]
        assert len(batches) == len(loader) and all(len(b) == 6 for b in batches[:-1])
        seen.append([i for b in batches for i in b])
    assert_epoch_coverage(seen, indexed_val_source.num_samples)
    with pytest.raises(UsageError, match=r"pipelines=2 \(--pipelines\) splits DALI pipelines, and the 'native' "
                                         r"backend \(--data-backend\) has none"):
        create_classification_loader(indexed_val_source, train=False, backend="native", pipelines=2)


def test_native_backend_rejects_record_formats(tiny_classification):
    with pytest.raises(DataError, match="native PyTorch backend reads image files"):
        create_classification_loader(tiny_classification / "tfrecord", train=False, backend="native")


def test_unknown_backend_and_missing_gpu():
    with pytest.raises(ValueError, match="backend must be one of"):
        create_classification_loader("x", train=False, backend="dali")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="dali-gpu needs a CUDA GPU"):
            from crossdali.common.data.sources import DataSource

            src = DataSource(format="filelist", root=None, files=("a.jpg",), labels=(0,), num_samples=1)
            create_classification_loader(src, train=False, backend="dali-gpu")


def test_corrupt_jpeg_error_names_the_file(tmp_path, tiny_classification):
    import shutil

    for cls in ("a", "b"):
        (tmp_path / "val" / cls).mkdir(parents=True)
        for f in sorted((tiny_classification / "imagefolder" / "val" / "coffee").glob("*.jpg"))[:3]:
            shutil.copy(f, tmp_path / "val" / cls / f.name)
    bad = tmp_path / "val" / "b" / "zz_broken.jpg"
    bad.write_bytes((tmp_path / "val" / "a" / "0000.jpg").read_bytes()[:300] + bytes(range(256)) * 8)
    # refused up front by the check's fast pass (crossdali.common.data.check), for both backends alike
    with pytest.raises(DataError, match="zz_broken.jpg cannot be decoded"):
        list(create_classification_loader(tmp_path, train=False, backend="dali-cpu", batch_size=4, crop_size=16))
    with pytest.raises(DataError, match="zz_broken.jpg cannot be decoded"):
        list(create_classification_loader(tmp_path, train=False, backend="native", batch_size=4, crop_size=16,
                                          workers=0))


def test_prefetch_depth_does_not_change_the_batches(indexed_val_source):
    """``prefetch_queue_depth`` only changes how far DALI works ahead: the same images and labels."""
    epochs = {}
    for depth in (1, 3):
        loader = create_classification_loader(indexed_val_source, train=True, backend="dali-cpu", batch_size=8,
                                              crop_size=16, workers=1, prefetch_queue_depth=depth)
        epochs[depth] = [(images.clone(), labels.clone()) for images, labels in loader]
    assert len(epochs[1]) == len(epochs[3]) > 1
    for (a, la), (b, lb) in zip(epochs[1], epochs[3], strict=True):
        assert torch.equal(la, lb) and torch.equal(a, b)


@pytest.mark.parametrize("backend", ["dali-cpu", "native", "synthetic"])
def test_channels_last_and_float16_keep_the_values(indexed_val_source, backend):
    """What the training script asks for under ``--amp --channels-last`` on a GPU: the same val images,
    channels-last in memory (DALI and the native preset write NHWC, the batch is its NCHW view), and
    in float16 the float32 values rounded once to nearest."""
    kw = dict(train=False, backend=backend, batch_size=16, crop_size=24, workers=1)
    plain = [x for x, _ in create_classification_loader(indexed_val_source, **kw)]
    fast = [x for x, _ in create_classification_loader(indexed_val_source, dtype="float16", channels_last=True, **kw)]
    assert len(fast) == len(plain) > 1
    for a, b in zip(plain, fast, strict=True):
        assert b.dtype == torch.float16 and b.shape == a.shape == (b.shape[0], 3, 24, 24)
        assert b.is_contiguous(memory_format=torch.channels_last) and not b.is_contiguous()
        assert torch.equal(b, a.half())
        # a model in channels_last takes the batch as it is: no copy
        assert b.contiguous(memory_format=torch.channels_last).data_ptr() == b.data_ptr()


def test_channels_last_over_two_pipelines(indexed_val_source):
    """Two pipelines' NHWC halves are joined before the view: still every image once, channels-last."""
    kw = dict(train=False, backend="dali-cpu", batch_size=8, crop_size=16, workers=1, pipelines=2)
    plain = list(create_classification_loader(indexed_val_source, **kw))
    fast = list(create_classification_loader(indexed_val_source, channels_last=True, **kw))
    for (a, la), (b, lb) in zip(plain, fast, strict=True):
        assert torch.equal(la, lb) and torch.equal(a, b) and b.is_contiguous(memory_format=torch.channels_last)
