"""MXNet DataIter: batches, MXNet's pad convention, epochs, resets, exactly-once sharding, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mxnet")

from crossdali.common.data.sample_data.formats import write_recordio  # noqa: E402
from crossdali.common.data.sources import DataSource, resolve_source  # noqa: E402
from crossdali.common.distributed import DistInfo  # noqa: E402
from crossdali.common.errors import DataError  # noqa: E402
from crossdali.mxnet import create_classification_loader  # noqa: E402

pytestmark = pytest.mark.mxnet
CROP = 32


def _labels(batches) -> list[int]:
    """Labels of the real rows of each batch (the ``pad`` trailing rows dropped)."""
    return [int(v) for b in batches for v in b.label[0].asnumpy()[: b.data[0].shape[0] - b.pad]]


@pytest.fixture(scope="module")
def indexed_recordio(tmp_path_factory, indexed_val_source) -> DataSource:
    """The val set as RecordIO whose labels are the sample indices (for the native backend)."""
    folder = tmp_path_factory.mktemp("indexed_rec")
    write_recordio(folder / "val.rec", [(Path(f).read_bytes(), i) for i, f in enumerate(indexed_val_source.files)])
    return resolve_source(folder, "val")


@pytest.mark.parametrize("backend", ["dali-cpu", "native", "synthetic"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "val"])
def test_backends_yield_full_size_batches_with_pad(tiny_classification, backend, train):
    data = tiny_classification / ("recordio" if backend == "native" else "imagefolder")
    it = create_classification_loader(data, train=train, backend=backend, batch_size=16, crop_size=CROP, workers=2)
    assert isinstance(it, mx.io.DataIter)
    assert [(d.name, d.shape) for d in it.provide_data] == [("data", (16, 3, CROP, CROP))]
    assert [(d.name, d.shape) for d in it.provide_label] == [("softmax_label", (16,))]
    batches = list(it)
    n = 264 if train else 55
    assert len(batches) == len(it) == -(-n // 16)  # 17 and 4
    for b in batches:
        assert isinstance(b, mx.io.DataBatch)
        assert b.data[0].shape == (16, 3, CROP, CROP) and b.data[0].dtype == np.float32  # always full size
        assert b.label[0].shape == (16,) and b.label[0].dtype == np.float32
        labels = b.label[0].asnumpy()[: 16 - b.pad]
        assert labels.min() >= 0 and labels.max() < 11 and np.all(labels == labels.round())
    if backend != "synthetic":
        assert [b.pad for b in batches] == [0] * (len(batches) - 1) + [16 * len(batches) - n]  # 8 and 9


@pytest.mark.parametrize("fmt", ["imagefolder", "tfrecord", "recordio", "webdataset"])
def test_dali_val_labels_in_order_for_every_format(tiny_classification, fmt):
    it = create_classification_loader(tiny_classification / fmt, train=False, batch_size=16, crop_size=CROP, workers=2)
    assert _labels(it) == list(resolve_source(tiny_classification / "imagefolder", "val").labels)


def test_native_val_labels_in_order(tiny_classification):
    it = create_classification_loader(tiny_classification / "recordio", train=False, backend="native", batch_size=16,
                                      crop_size=CROP, workers=2)
    expected = list(resolve_source(tiny_classification / "imagefolder", "val").labels)
    for _ in range(2):  # and again after reset: MXNet leaves stale rows in the last batch, pad must cover them
        assert _labels(it) == expected
        it.reset()


def test_val_padding_repeats_the_last_sample(indexed_val_source):
    it = create_classification_loader(indexed_val_source, train=False, batch_size=16, crop_size=CROP, workers=1)
    last = list(it)[-1]
    assert last.pad == 9 and last.label[0].asnumpy()[6:].tolist() == [54.0] * 10  # 7 real rows, the 7th repeated


@pytest.mark.parametrize("backend", ["dali-cpu", "native"])
@pytest.mark.parametrize("shards", [1, 2, 3])
def test_val_exactly_once_over_shards(indexed_val_source, indexed_recordio, assert_epoch_coverage, backend, shards):
    source = indexed_recordio if backend == "native" else indexed_val_source
    seen: list[list[list[int]]] = [[], []]
    for rank in range(shards):
        it = create_classification_loader(source, train=False, backend=backend, batch_size=8, crop_size=16, workers=1,
                                          dist=DistInfo(rank, shards, rank, "test"))
        for epoch in range(2):  # the second epoch (after reset) must be exactly-once as well
            seen[epoch].append(_labels(it))
            it.reset()
    for epoch in seen:
        assert_epoch_coverage(epoch, indexed_val_source.num_samples)


def test_padding_only_batch_is_skipped(indexed_val_source, assert_epoch_coverage):
    # 10 samples over 4 shards (3, 2, 3, 2) with batch 2: DALI pads every shard to 4 samples, so shards
    # 1 and 3 would end with a batch of padding only; the iterator skips it.
    small = DataSource(format="filelist", root=indexed_val_source.root, files=indexed_val_source.files[:10],
                       labels=tuple(range(10)), num_samples=10)
    seen = []
    for rank in range(4):
        it = create_classification_loader(small, train=False, batch_size=2, crop_size=16, workers=1,
                                          dist=DistInfo(rank, 4, rank, "test"))
        batches = list(it)
        assert all(b.pad < 2 for b in batches)
        seen.append(_labels(batches))
    assert_epoch_coverage(seen, 10)


@pytest.mark.parametrize("backend", ["dali-cpu", "native"])
def test_train_single_process_every_sample_each_epoch(indexed_val_source, indexed_recordio, assert_epoch_coverage,
                                                      backend):
    # native: MXNet's round_batch would wrap into the next pass (measured: epochs of 528, 256, 272
    # samples); the wrapper keeps every epoch exactly once instead
    source = indexed_recordio if backend == "native" else indexed_val_source
    it = create_classification_loader(source, train=True, backend=backend, batch_size=8, crop_size=16, workers=1)
    epochs = []
    for _ in range(3):
        epochs.append(_labels(it))
        it.reset()
    for labels in epochs:
        assert_epoch_coverage([labels], indexed_val_source.num_samples)
    assert epochs[0] != epochs[1]  # reshuffled between epochs


@pytest.mark.parametrize("backend", ["dali-cpu", "native"])
def test_train_two_shards_drop_to_equal_full_batches(indexed_val_source, indexed_recordio, backend):
    source = indexed_recordio if backend == "native" else indexed_val_source
    seen = []
    for rank in range(2):
        it = create_classification_loader(source, train=True, backend=backend, batch_size=8, crop_size=16, workers=1,
                                          dist=DistInfo(rank, 2, rank, "test"))
        # read each batch as it comes: ImageRecordIter recycles its batch buffers (prefetch_buffer)
        labels, pads = [], []
        for b in it:
            labels += _labels([b])
            pads.append(b.pad)
        assert len(pads) == len(it) == 3 and pads == [0, 0, 0]  # 27 or 28 per shard -> 3 full batches each
        seen.append(labels)
    flat = seen[0] + seen[1]
    assert len(flat) == len(set(flat)) == 48  # disjoint; 7 samples left out this epoch


@pytest.mark.parametrize("train", [True, False], ids=["train", "val"])
def test_reset_mid_epoch_starts_a_whole_new_epoch(indexed_val_source, assert_epoch_coverage, train):
    it = create_classification_loader(indexed_val_source, train=train, batch_size=8, crop_size=16, workers=1)
    first = [it.next() for _ in range(2)]
    assert len(first) == 2
    it.reset()  # mid-epoch: the rest of the epoch is discarded
    epoch = list(it)
    assert len(epoch) == 7
    assert_epoch_coverage([_labels(epoch)], indexed_val_source.num_samples)
    if not train:
        assert _labels(epoch)[:16] == _labels(first)  # val restarts at its first sample


def test_reset_and_iter_semantics(indexed_val_source):
    it = create_classification_loader(indexed_val_source, train=False, batch_size=8, crop_size=16, workers=1)
    it.reset()  # before anything was read: no-op
    it.reset()
    a = _labels(it)  # iterates to StopIteration
    with pytest.raises(StopIteration):
        it.next()  # stays at the end until reset (MXNet's DataIter contract)
    it.reset()
    it.reset()  # a second reset at the start of an epoch must not skip it
    b = _labels(it)
    c = _labels(it)  # iter() after a finished epoch resets by itself (Gluon-style loops)
    assert a == b == c == list(range(55))


def test_batches_stay_valid_after_more_are_read(tiny_classification):
    """The zero-copy hand-over keeps each batch's memory alive: a batch held over a whole epoch
    equals a fresh pipeline's output bit for bit."""
    from crossdali.common.classification import ClassificationTransform, PipelineOptions, create_classification_pipeline

    source = resolve_source(tiny_classification / "imagefolder", "val")
    it = create_classification_loader(source, train=False, batch_size=16, crop_size=CROP, workers=2)
    held = [(b.data[0], b.label[0]) for b in it]
    pipe = create_classification_pipeline(source, train=False, options=PipelineOptions(batch_size=16, num_threads=2),
                                          transform=ClassificationTransform(crop_size=CROP))
    pipe.build()
    for images, labels in held:
        ref_images, ref_labels = (np.asarray(out.as_tensor()) for out in pipe.run())
        assert np.array_equal(images.asnumpy(), ref_images)
        assert np.array_equal(labels.asnumpy(), ref_labels.reshape(-1).astype(np.float32))


def test_module_fit_and_score(tiny_classification):
    """The symbolic API: Module.fit trains from the iterator; Module.predict drops the ``pad`` rows
    (Module.score does not: MXNet scores padding, as with its own NDArrayIter)."""
    train = create_classification_loader(tiny_classification / "imagefolder", train=True, batch_size=24,
                                         crop_size=CROP, workers=2)
    val = create_classification_loader(tiny_classification / "imagefolder", train=False, batch_size=24,
                                       crop_size=CROP, workers=2)
    data = mx.sym.var("data")
    net = mx.sym.Convolution(data, kernel=(3, 3), stride=(2, 2), num_filter=16)
    net = mx.sym.Activation(mx.sym.BatchNorm(net), act_type="relu")
    net = mx.sym.mean(net, axis=(2, 3))
    net = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(net, num_hidden=11), name="softmax")
    mod = mx.mod.Module(net, context=mx.cpu())
    mod.fit(train, num_epoch=2, optimizer="adam", optimizer_params={"learning_rate": 0.01},
            initializer=mx.init.Xavier())
    probs = mod.predict(val).asnumpy()
    assert probs.shape == (55, 11)  # the 17 padding rows of the last batch are dropped
    labels = np.array(resolve_source(tiny_classification / "imagefolder", "val").labels)
    assert (probs.argmax(axis=1) == labels).mean() > 2 / 11  # two epochs of a tiny conv net beat chance (1/11)


def test_missing_index_is_a_clear_error(tmp_path, tiny_classification):
    (tmp_path / "val.rec").write_bytes((tiny_classification / "recordio" / "val.rec").read_bytes())
    with pytest.raises(DataError, match=r"val\.rec has no index file .*val\.idx"):
        create_classification_loader(tmp_path, train=False, backend="native")
    with pytest.raises(DataError, match=r"val\.rec has no index file"):
        create_classification_loader(tmp_path, train=False, backend="dali-cpu")


def test_empty_record_file_is_a_clear_error(tmp_path):
    (tmp_path / "val.rec").write_bytes(b"")
    (tmp_path / "val.idx").write_text("")
    with pytest.raises(DataError, match=r"val\.rec is empty"):
        create_classification_loader(tmp_path, train=False, backend="native")


def test_native_needs_recordio(tiny_classification):
    with pytest.raises(DataError, match="native MXNet backend .* reads RecordIO"):
        create_classification_loader(tiny_classification / "imagefolder", train=False, backend="native")


def test_bad_backend_and_missing_gpu_are_named(tiny_classification):
    with pytest.raises(ValueError, match="backend must be one of"):
        create_classification_loader(tiny_classification / "imagefolder", train=False, backend="dali")
    if mx.context.num_gpus() == 0:
        with pytest.raises(RuntimeError, match="dali-gpu needs MXNet built with CUDA"):
            create_classification_loader(tiny_classification / "imagefolder", train=False, backend="dali-gpu")


@pytest.mark.gpu
def test_dali_gpu_hands_over_on_the_gpu(tiny_classification):
    """Not run so far: no MXNet GPU wheel has kernels for an H100 (sm_90), the only GPU reachable (docs/mxnet.md)."""
    if mx.context.num_gpus() == 0:
        pytest.skip("MXNet sees no GPU (the PyPI mxnet wheel is CPU-only; mxnet-cu112/cu117 on a GPU up to sm_86 is needed)")
    it = create_classification_loader(tiny_classification / "imagefolder", train=False, backend="dali-gpu",
                                      batch_size=16, crop_size=CROP, workers=2, device_id=0)
    batches = list(it)
    assert all(b.data[0].context == mx.gpu(0) and b.label[0].context == mx.gpu(0) for b in batches)
    assert _labels(batches) == list(resolve_source(tiny_classification / "imagefolder", "val").labels)
