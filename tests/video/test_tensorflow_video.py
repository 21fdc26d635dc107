"""The clip pipeline through TensorFlow's DALIDataset (CPU mode): shapes, labels, exactly-once val.

Runs in the TensorFlow environment (needs tensorflow, the DALI TF plugin and PyAV).
"""

from __future__ import annotations

from collections import Counter

import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("nvidia.dali.plugin.tf", reason="needs the DALI TensorFlow plugin")

pytestmark = pytest.mark.tensorflow


@pytest.mark.parametrize("layout", ["NFHWC", "NCFHW"])
def test_tf_clip_shapes(tiny_video, layout):
    from crossdali.tensorflow.video import create_video_loader

    loader = create_video_loader(tiny_video, train=True, batch_size=6, sequence_length=8, stride=2, crop_size=48,
                                 layout=layout, workers=2)
    clips, labels = next(iter(loader))
    assert tuple(clips.shape) == ((6, 8, 48, 48, 3) if layout == "NFHWC" else (6, 3, 8, 48, 48))
    assert clips.dtype == tf.float32 and labels.dtype == tf.int64 and tuple(labels.shape) == (6,)
    assert bool(tf.reduce_all(tf.math.is_finite(clips)))


def test_tf_val_labels_and_exactly_once_over_two_shards(tiny_video):
    """Val clips in file-list order, every clip once across 2 shards (odd count, padding dropped)."""
    from crossdali.common.data.videos import check_videos
    from crossdali.common.distributed import DistInfo
    from crossdali.common.video import ClipTransform, resolve_video_source
    from crossdali.tensorflow.video import create_video_loader

    src = resolve_video_source(tiny_video, "val")
    t = ClipTransform(sequence_length=4, stride=2)
    per_file = [(i.num_frames - t.frames_needed) // t.clip_step + 1 for i in check_videos(src.files, device="cpu")]
    expected = [lbl for lbl, n in zip(src.labels, per_file, strict=True) for _ in range(n)]
    one = create_video_loader(src, train=False, batch_size=7, sequence_length=4, stride=2, crop_size=32, workers=2)
    got = [int(x) for _, labels in one for x in labels.numpy()]
    assert got == expected
    assert [int(x) for _, labels in one for x in labels.numpy()] == expected  # a second epoch: the same clips

    shards = []
    for rank in range(2):
        loader = create_video_loader(src, train=False, batch_size=5, sequence_length=4, stride=2, crop_size=32,
                                     workers=2, dist=DistInfo(rank=rank, world_size=2))
        shards.append([int(x) for _, labels in loader for x in labels.numpy()])
    assert sum(map(len, shards)) == len(expected)
    assert Counter(shards[0] + shards[1]) == Counter(expected)
    # contiguous shards: rank 0 reads the first half of the clips, rank 1 the rest
    assert shards[0] + shards[1] == expected


def test_tf_reads_of_three_clips_unfold_into_clips(tiny_video):
    """``clips_per_read=3``: batches of 6 clips (2 reads), the 3 clips of a read from one file, every file
    giving the clips of its read grid once an epoch, through both the loader and its ``dataset``."""
    from crossdali.common.data.sources import DataSource
    from crossdali.common.data.videos import check_videos
    from crossdali.common.video import ClipTransform, resolve_video_source
    from crossdali.tensorflow.video import create_video_loader

    val = resolve_video_source(tiny_video, "val")
    src = DataSource(format="filelist", root=val.root, files=val.files, labels=tuple(range(len(val.files))),
                     num_samples=len(val.files))
    t = ClipTransform(sequence_length=4, stride=2, clips_per_read=3)
    per_file = [3 * ((i.num_frames - t.read.frames_needed) // t.read.clip_step + 1)
                for i in check_videos(src.files, device="cpu")]
    loader = create_video_loader(src, train=True, batch_size=6, sequence_length=4, stride=2, crop_size=32, workers=2,
                                 clips_per_read=3, last_batch="partial")
    assert loader.batch_size == 6 and loader.num_samples == sum(per_file)
    labels_seen = []
    for clips, labels in loader:
        assert tuple(clips.shape[1:]) == (4, 32, 32, 3) and clips.shape[0] == labels.shape[0]
        assert clips.shape[0] % 3 == 0 and clips.shape[0] <= 6
        groups = labels.numpy().reshape(-1, 3)
        assert (groups == groups[:, :1]).all()  # a read's clips come from one file
        labels_seen += labels.numpy().tolist()
    assert Counter(labels_seen) == {i: n for i, n in enumerate(per_file) if n}
    clips, labels = next(iter(loader.dataset))
    assert tuple(clips.shape) == (6, 4, 32, 32, 3) and tuple(labels.shape) == (6,)


@pytest.mark.gpu
@pytest.mark.parametrize("handover", ["dataset", "dlpack"])
@pytest.mark.parametrize("codec_dir", ["", "h264"], ids=["vp9", "h264"])
def test_tf_dali_gpu_clips_stay_on_the_gpu(request, codec_dir, handover):
    """NVDEC clips (VP9, and H.264 that the CPU cannot decode) and their labels on the GPU, through either
    hand-over; every val clip once."""
    if not tf.config.list_physical_devices("GPU"):
        pytest.skip("no GPU visible to TensorFlow (tensorflow-cpu, or no CUDA GPU)")
    gpu_video = request.getfixturevalue("gpu_video")  # built only where the test runs
    from crossdali.tensorflow.video import create_video_loader

    loader = create_video_loader(gpu_video / codec_dir if codec_dir else gpu_video, train=False, backend="dali-gpu",
                                 batch_size=8, sequence_length=8, stride=2, crop_size=48, device_id=0,
                                 handover=handover)
    seen = 0
    for clips, labels in loader:
        assert "GPU" in clips.device and "GPU" in labels.device, (clips.device, labels.device)
        assert tuple(clips.shape[1:]) == (8, 48, 48, 3) and tuple(labels.shape) == (clips.shape[0],)
        seen += int(clips.shape[0])
    assert seen == loader.num_samples > 0


@pytest.mark.parametrize("train", [True, False], ids=["train-3-clips-a-read", "val"])
def test_tf_dlpack_handover_gives_the_dalidataset_clips(tiny_video, assert_handovers_agree, train):
    """DALI's buffers shared through DLPack: two epochs of clips and labels equal to ``DALIDataset``'s bit for bit
    (train: reads of 3 clips unfolded into clips, the second epoch reshuffled)."""
    from crossdali.tensorflow.video import create_video_loader

    epochs = assert_handovers_agree(
        lambda handover: create_video_loader(
            tiny_video, train=train, batch_size=6, sequence_length=4, stride=2, crop_size=32, workers=2, seed=7,
            clips_per_read=3 if train else None, handover=handover, hold_batches=2),
        outputs=("clips", "labels"))
    assert len(epochs[0]) > 1
