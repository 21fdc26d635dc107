"""The framework-free external-source parts: epoch and shard arithmetic of the source adapters
(real ``SampleInfo``), the errors a user's source gets, and the DALI pipeline over it (CPU)."""

from __future__ import annotations

import numpy as np
import pytest
from nvidia.dali.types import SampleInfo

from crossdali.common.classification import ClassificationTransform, PipelineOptions, create_classification_pipeline
from crossdali.common.distributed import DistInfo
from crossdali.common.errors import DataError
from crossdali.common.external import ExternalSourceOptions, create_external_source_pipeline, prepare_external_source
from crossdali.common.loading.epochs import LastBatchPolicy
from crossdali.common.loading.external_readers import IndexedSamples, StreamBatches, to_sample

BACKENDS = ("dali-cpu", "dali-gpu")



def _epoch(samples: IndexedSamples, epoch: int = 0) -> list[int]:
    """Labels (= sample ids) one shard delivers in ``epoch``: the callable asked as DALI asks it."""
    out, i = [], 0
    while True:
        try:
            _, label = samples(SampleInfo(i, i % samples.batch_size, i // samples.batch_size, epoch))
        except StopIteration:
            break
        out.append(int(label[0]))
        i += 1
    assert i % samples.batch_size == 0  # whole batches only: DALI drops a batch the source stops inside
    return out[:samples.samples_in_epoch]


def _indexed(items, *, shard, world, policy, shuffle=True, batch_size=8):
    return IndexedSamples(items.__getitem__, num_samples=len(items), num_classes=len(items), batch_size=batch_size,
                          shard_id=shard, num_shards=world, shuffle=shuffle, seed=3, policy=policy, name="items")


@pytest.mark.parametrize("world", [1, 2, 3])
def test_indexed_partial_epoch_is_every_sample_once_across_shards(val_items, world, assert_epoch_coverage):
    for epoch in (0, 1):
        shards = [_epoch(_indexed(val_items, shard=r, world=world, policy=LastBatchPolicy.PARTIAL), epoch)
                  for r in range(world)]
        assert_epoch_coverage(shards, len(val_items))
    first = _epoch(_indexed(val_items, shard=0, world=1, policy=LastBatchPolicy.PARTIAL), 0)
    second = _epoch(_indexed(val_items, shard=0, world=1, policy=LastBatchPolicy.PARTIAL), 1)
    assert first != second and sorted(first) == sorted(second)  # reshuffled every epoch


def test_indexed_drop_gives_every_rank_the_same_whole_batches(val_items):
    shards = [_epoch(_indexed(val_items, shard=r, world=2, policy=LastBatchPolicy.DROP)) for r in range(2)]
    assert [len(s) for s in shards] == [24, 24]  # 55 // 2 = 27 per rank -> 3 whole batches of 8
    assert not set(shards[0]) & set(shards[1])


def test_indexed_val_reads_in_order(val_items):
    assert _epoch(_indexed(val_items, shard=0, world=1, policy=LastBatchPolicy.PARTIAL, shuffle=False)) == \
        list(range(len(val_items)))


def test_stream_batches_stride_limit_batched_and_skip(val_items):
    def labels(gen):
        return [[int(x[0]) for x in batch[1]] for batch in gen()]

    plain = labels(StreamBatches(val_items, batch_size=8, num_classes=55, name="s"))
    assert [len(b) for b in plain] == [8] * 6 + [7] and sum(plain, []) == list(range(55))
    strided = [sum(labels(StreamBatches(val_items, batch_size=8, num_classes=55, name="s", stride=(r, 2))), [])
               for r in range(2)]
    assert strided == [list(range(0, 55, 2)), list(range(1, 55, 2))]
    limited = labels(StreamBatches(val_items, batch_size=8, num_classes=55, name="s", limit=24))
    assert sum(limited, []) == list(range(24))
    skipping = StreamBatches(val_items, batch_size=8, num_classes=55, name="s", skip=2)
    assert sum(labels(skipping), []) == list(range(16, 55)) and sum(labels(skipping), []) == list(range(55))
    batches = [([b for b, _ in val_items[i:i + 5]], [lab for _, lab in val_items[i:i + 5]]) for i in range(0, 55, 5)]
    assert sum(labels(StreamBatches(batches, batch_size=8, num_classes=55, name="s", batched=True)), []) == \
        list(range(55))


def test_stream_shorter_than_promised_fails_loudly(val_items):
    with pytest.raises(DataError, match="gave 55 samples on this rank, fewer than the 64"):
        list(StreamBatches(val_items, batch_size=8, num_classes=55, name="s", limit=64)())


def test_one_shot_iterator_refuses_a_second_epoch(val_items):
    stream = StreamBatches(iter(val_items), batch_size=8, num_classes=55, name="gen")
    assert len(list(stream())) == 7
    with pytest.raises(DataError, match="one-shot iterator"):
        list(stream())


def test_bad_samples_are_named(val_items):
    gif = b"GIF89a" + b"\x00" * 32
    with pytest.raises(DataError, match=r"sample 7 of src is a GIF file.*re-encode"):
        to_sample((gif, 0), index=7, name="src", num_classes=2)
    with pytest.raises(DataError, match=r"sample 3 of src: label 9 is outside \[0, num_classes=2\)"):
        to_sample((val_items[0][0], 9), index=3, name="src", num_classes=2)
    with pytest.raises(DataError, match="not a pair"):
        to_sample(val_items[0][0], index=0, name="src", num_classes=2)
    with pytest.raises(DataError, match="give the encoded file's bytes"):
        to_sample((np.zeros((4, 4, 3), np.float32), 0), index=0, name="src", num_classes=2)
    data, label = to_sample((val_items[0][0], 1), index=0, name="src", num_classes=2)
    assert data.dtype == np.uint8 and data.tobytes() == val_items[0][0] and label.tolist() == [1]


def test_prepare_rejects_what_it_cannot_size(val_items):
    common = dict(train=True, backend="dali-cpu", backends=BACKENDS, batch_size=8)
    with pytest.raises(ValueError, match="pass num_samples=N"):
        prepare_external_source(lambda i: val_items[i], num_classes=55, **common)
    with pytest.raises(ValueError, match="pass num_classes=N"):
        prepare_external_source(val_items, **common)
    with pytest.raises(ValueError, match="data backend must be one of"):
        prepare_external_source(val_items, num_classes=55, **{**common, "backend": "native"})
    with pytest.raises(ValueError, match="fewer than the 64 ranks"):
        prepare_external_source(val_items, num_classes=55, dist=DistInfo(rank=0, world_size=64), **common)
    with pytest.raises(ValueError, match="shard='self' needs"):
        prepare_external_source(iter(val_items), num_classes=55, feed=ExternalSourceOptions(shard="self"), **common)
    with pytest.raises(ValueError, match="py_start_method"):
        ExternalSourceOptions(py_start_method="forkserver")
    plan = prepare_external_source(lambda i: val_items[i], num_samples=55, num_classes=55, **common)
    assert plan.kind == "indexed" and plan.plan.policy == LastBatchPolicy.PARTIAL
    assert prepare_external_source(iter(val_items), num_classes=55, **common).shard_mode == "stride"


def test_external_val_pipeline_equals_the_reader_pipeline(val_items, indexed_val_source):
    """The same JPEG bytes through external_source and through fn.readers.file: the same val tensors."""
    options = PipelineOptions(batch_size=8, num_threads=2)
    transform = ClassificationTransform(crop_size=32)
    ext = prepare_external_source(val_items, train=False, backend="dali-cpu", backends=BACKENDS, batch_size=8,
                                  num_classes=55, transform=transform)
    pipes = [ext.build(options), create_classification_pipeline(indexed_val_source, train=False, options=options,
                                                                 transform=transform)]
    for p in pipes:
        p.build()
    for _ in range(3):
        (a_img, a_lab), (b_img, b_lab) = (p.run() for p in pipes)
        np.testing.assert_array_equal(np.array(a_img.as_tensor()), np.array(b_img.as_tensor()))
        np.testing.assert_array_equal(np.array(a_lab.as_tensor()), np.array(b_lab.as_tensor()))


def test_generator_function_pipeline_runs_epochs(val_items):
    def samples():
        yield from val_items[:20]

    pipe = create_external_source_pipeline(
        StreamBatches(samples, batch_size=8, num_classes=55, name="gen"), batch=True, train=True,
        options=PipelineOptions(batch_size=8, num_threads=2), transform=ClassificationTransform(crop_size=32))
    pipe.build()
    for _ in range(2):  # two epochs: 8 + 8 + 4, then StopIteration, then the same again after reset
        sizes = [len(pipe.run()[1]) for _ in range(3)]
        assert sizes == [8, 8, 4]
        with pytest.raises(StopIteration):
            pipe.run()
        pipe.reset()
