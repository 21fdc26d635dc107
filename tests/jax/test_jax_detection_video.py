"""The detection (SSD300) and video clip pipelines through DALI's JAX iterator (CPU mode): shapes,
the very same numbers as the shared pipeline run directly, exactly-once val over shards."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("nvidia.dali.plugin.jax")

from crossdali.common.detection import (  # noqa: E402
    TRAIN_OUTPUTS,
    VAL_OUTPUTS,
    create_detection_pipeline,
    resolve_detection_source,
)
from crossdali.common.distributed import DistInfo  # noqa: E402
from crossdali.common.options import PipelineOptions  # noqa: E402
from crossdali.jax import create_detection_loader, create_video_loader  # noqa: E402

pytestmark = pytest.mark.jax


@pytest.mark.parametrize("train", [True, False], ids=["train", "val"])
def test_detection_identical_to_pipeline(detection_root, train):
    src = resolve_detection_source(detection_root, "train" if train else "val")
    pipe = create_detection_pipeline(src, train=train, options=PipelineOptions(batch_size=8, num_threads=2, seed=11))
    pipe.build()
    direct = [np.asarray(x.as_tensor()) for x in pipe.run()]
    loader = create_detection_loader(src, train=train, batch_size=8, workers=2, seed=11)
    assert len(loader) == (12 if train else 3)
    batch = next(iter(loader))
    for name, got, want in zip(TRAIN_OUTPUTS if train else VAL_OUTPUTS, batch, direct):
        assert isinstance(got, jax.Array)
        np.testing.assert_array_equal(np.asarray(got), want.reshape(got.shape), err_msg=name)
    if train:
        images, offsets, labels = batch
        assert images.shape == (8, 3, 300, 300) and offsets.shape == (8, 8732, 4) and labels.shape == (8, 8732)
        assert int((labels > 0).sum()) > 0
    else:
        assert batch[3].shape == (8,)  # image ids flattened


def test_detection_val_exactly_once_over_shards(detection_root):
    coco = json.loads((detection_root / "annotations" / "instances_val.json").read_text())
    seen = []
    for rank in range(2):
        loader = create_detection_loader(detection_root, train=False, batch_size=5, workers=1,
                                         dist=DistInfo(rank=rank, world_size=2, local_rank=0, launcher="test"))
        seen += [int(i) for *_, ids in loader for i in ids.tolist()]
    assert sorted(seen) == sorted(im["id"] for im in coco["images"])


def test_detection_two_pipelines_val_every_image_once_with_its_boxes(detection_root):
    """Two pipelines' val parts are padded to their own longest: merged into one jax.Array, each image keeps
    its own boxes and labels, as with one pipeline."""
    coco = json.loads((detection_root / "annotations" / "instances_val.json").read_text())
    by_id = {}
    for pipelines in (1, 2):
        loader = create_detection_loader(detection_root, train=False, batch_size=8, workers=1, pipelines=pipelines)
        seen = {}
        for _, boxes, labels, image_ids in loader:
            boxes, labels = np.asarray(boxes), np.asarray(labels)
            assert boxes.shape[:2] == labels.shape and not boxes[labels == 0].any()
            for i, b, lab in zip(np.asarray(image_ids).tolist(), boxes, labels):
                assert i not in seen
                seen[i] = (b[lab > 0], lab[lab > 0])
        assert sorted(seen) == sorted(im["id"] for im in coco["images"])
        by_id[pipelines] = seen
    for i, (b, lab) in by_id[1].items():
        np.testing.assert_array_equal(by_id[2][i][0], b)
        np.testing.assert_array_equal(by_id[2][i][1], lab)


@pytest.mark.parametrize("layout", ["NFHWC", "NCFHW"])
def test_clip_shapes(tiny_video, layout):
    loader = create_video_loader(tiny_video, train=True, batch_size=6, sequence_length=8, stride=2, crop_size=48,
                                 layout=layout, workers=2)
    clips, labels = next(iter(loader))
    assert clips.shape == ((6, 8, 48, 48, 3) if layout == "NFHWC" else (6, 3, 8, 48, 48))
    assert clips.dtype == jax.numpy.float32 and labels.shape == (6,) and bool(jax.numpy.isfinite(clips).all())


def test_video_val_in_order_and_exactly_once_over_two_shards(tiny_video):
    from crossdali.common.data.videos import check_videos
    from crossdali.common.video import ClipTransform, resolve_video_source

    src = resolve_video_source(tiny_video, "val")
    t = ClipTransform(sequence_length=4, stride=2)
    per_file = [(i.num_frames - t.frames_needed) // t.clip_step + 1 for i in check_videos(src.files, device="cpu")]
    expected = [lbl for lbl, n in zip(src.labels, per_file, strict=True) for _ in range(n)]
    one = create_video_loader(src, train=False, batch_size=7, sequence_length=4, stride=2, crop_size=32, workers=2)
    assert [int(x) for _, labels in one for x in labels.tolist()] == expected
    shards = []
    for rank in range(2):
        loader = create_video_loader(src, train=False, batch_size=5, sequence_length=4, stride=2, crop_size=32,
                                     workers=2, dist=DistInfo(rank=rank, world_size=2))
        shards.append([int(x) for _, labels in loader for x in labels.tolist()])
    assert Counter(shards[0] + shards[1]) == Counter(expected) and shards[0] + shards[1] == expected


def test_video_pipelines_merge_into_one_batch_with_every_clip_once(tiny_video):
    """pipelines=2 through DALI's JAX iterator: batches of 3 + 3 clips concatenated on the device, every
    val clip once, len() the batch count, and one DALI checkpoint per pipeline in the state."""
    from crossdali.common.data.videos import check_videos
    from crossdali.common.video import ClipTransform, resolve_video_source

    src = resolve_video_source(tiny_video, "val")
    t = ClipTransform(sequence_length=4, stride=2)
    per_file = [(i.num_frames - t.frames_needed) // t.clip_step + 1 for i in check_videos(src.files, device="cpu")]
    expected = [lbl for lbl, n in zip(src.labels, per_file, strict=True) for _ in range(n)]
    loader = create_video_loader(src, train=False, batch_size=6, sequence_length=4, stride=2, crop_size=32,
                                 workers=1, pipelines=2)
    batches = [(clips.shape, [int(x) for x in labels.tolist()]) for clips, labels in loader]
    assert len(batches) == len(loader) and batches[0][0] == (6, 4, 32, 32, 3)
    assert Counter(lbl for _, labels in batches for lbl in labels) == Counter(expected)
    assert len(loader.state_dict()["dali"]) == 2


def test_reads_of_several_clips_unfold_into_clips(tiny_video):
    """``clips_per_read=2`` through the JAX iterator: batches of clips (not reads), a label and a first
    frame per clip, the two clips of a read consecutive in their file, and every clip of the epoch once."""
    from crossdali.common.data.sources import DataSource
    from crossdali.common.video import resolve_video_source

    val = resolve_video_source(tiny_video, "val")
    src = DataSource(format="filelist", root=val.root, files=val.files, labels=tuple(range(len(val.files))),
                     num_samples=len(val.files))
    loader = create_video_loader(src, train=True, batch_size=4, sequence_length=4, stride=2, crop_size=32, workers=2,
                                 with_frame_num=True, clips_per_read=2, last_batch="partial")
    assert loader.batch_size == 4
    seen = []
    for clips, labels, frames in loader:
        assert isinstance(clips, jax.Array) and clips.shape[1:] == (4, 32, 32, 3) and clips.shape[0] % 2 == 0
        pairs = np.asarray(frames).reshape(-1, 2)
        assert (pairs[:, 1] - pairs[:, 0] == 8).all() and (np.asarray(labels).reshape(-1, 2)[:, 0] ==
                                                           np.asarray(labels).reshape(-1, 2)[:, 1]).all()
        seen += list(zip(np.asarray(labels).tolist(), np.asarray(frames).tolist(), strict=True))
    assert len(seen) == len(set(seen)) == loader.num_samples > 0
