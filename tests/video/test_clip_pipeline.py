"""The shared clip pipeline on real VP9 files, CPU mode: shapes, frame order, labels, epochs."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest


def _pytorch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("layout", ["NCFHW", "NFHWC"])
@pytest.mark.parametrize("train", [True, False])
def test_clip_shapes(tiny_video, layout, train):
    torch = _pytorch()
    from crossdali.pytorch.video import create_video_loader

    loader = create_video_loader(tiny_video, train=train, batch_size=6, sequence_length=8, stride=2,
                                 crop_size=48, layout=layout, workers=2)
    clips, labels = next(iter(loader))
    expected = (6, 3, 8, 48, 48) if layout == "NCFHW" else (6, 8, 48, 48, 3)
    assert tuple(clips.shape) == expected
    assert clips.dtype == torch.float32 and labels.dtype == torch.int64 and tuple(labels.shape) == (6,)
    assert torch.isfinite(clips).all()
    # normalized: roughly zero-centred, unit-scale values, not raw 0-255 pixels
    assert -3 < float(clips.mean()) < 3 and 0.2 < float(clips.std()) < 3
    assert set(labels.tolist()) <= {0, 1, 2, 3}


def _index_pipeline(files, *, sequence_length, stride, step):
    from crossdali.common.classification import PipelineOptions
    from crossdali.common.data.sources import DataSource
    from crossdali.common.video import ClipTransform, create_clip_pipeline

    src = DataSource(format="filelist", root=files[0].parent, files=tuple(map(str, files)),
                     labels=tuple(range(len(files))), num_samples=len(files))
    t = ClipTransform(sequence_length=sequence_length, stride=stride, step=step, crop_size=48,
                      mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), output_layout="FHWC")
    pipe = create_clip_pipeline(src, train=False, options=PipelineOptions(batch_size=1, num_threads=2),
                                transform=t, with_frame_num=True)
    pipe.build()
    return pipe, t


@pytest.mark.parametrize("sequence_length,stride,step", [(8, 1, None), (6, 3, 4), (5, 2, 7)])
def test_frame_order_inside_a_clip(tiny_video, sequence_length, stride, step):
    """Frames of a clip are consecutive with the stated stride, starting at the reported frame."""
    from crossdali.common.data.sample_data.video import INDEX_LEVEL_STEP
    from crossdali.common.video import VIDEO_READER_NAME

    files = sorted((tiny_video / "index").glob("count_*.webm"))
    lengths = [int(f.stem.split("_")[1]) for f in files]
    pipe, t = _index_pipeline(files, sequence_length=sequence_length, stride=stride, step=step)
    n = pipe.epoch_size(VIDEO_READER_NAME)
    expected = [(i, s) for i, length in enumerate(lengths) for s in range(0, length - t.frames_needed + 1, t.clip_step)]
    assert n == len(expected)
    seen = []
    for _ in range(n):
        clips, labels, frame_num = pipe.run()
        clip, label, start = np.asarray(clips[0]), int(np.asarray(labels[0])[0]), int(np.asarray(frame_num[0])[0])
        decoded = np.rint(clip.mean(axis=(1, 2, 3)) / INDEX_LEVEL_STEP).astype(int).tolist()
        assert decoded == [start + k * stride for k in range(sequence_length)], (label, start, decoded)
        seen.append((label, start))
    assert seen == expected  # val reads files in list order, clips in time order, none skipped


def test_labels_match_the_file_list(tiny_video):
    _pytorch()
    from crossdali.common.data.videos import check_videos
    from crossdali.common.video import ClipTransform, resolve_video_source
    from crossdali.pytorch.video import create_video_loader

    src = resolve_video_source(tiny_video, "val")
    t = ClipTransform(sequence_length=4, stride=2)
    per_file = [(i.num_frames - t.frames_needed) // t.clip_step + 1 for i in check_videos(src.files, device="cpu")]
    expected = [label for label, n in zip(src.labels, per_file, strict=True) for _ in range(n)]
    listed = [int(line.rsplit(maxsplit=1)[1]) for line in (tiny_video / "val.txt").read_text().splitlines()]
    assert list(src.labels) == listed and len(set(listed)) == 4

    val = create_video_loader(src, train=False, batch_size=7, sequence_length=4, stride=2, crop_size=32, workers=2)
    got = [lbl for _, labels in val for lbl in labels.tolist()]
    assert got == expected  # unshuffled: file-list order, each file's clips together

    train = create_video_loader(src, train=True, batch_size=7, sequence_length=4, stride=2, crop_size=32, workers=2)
    got = [lbl for _, labels in train for lbl in labels.tolist()]
    assert Counter(got) == Counter(expected) and got != expected  # shuffled, nothing lost or repeated


def test_val_exactly_once_over_two_shards(indexed_val_clips, assert_epoch_coverage):
    """Each (file, first frame) clip is seen once across 2 ranks, padding dropped (odd clip count)."""
    from crossdali.common.distributed import DistInfo
    from crossdali.pytorch.video import create_video_loader

    src, ids = indexed_val_clips
    seen = []
    for rank in range(2):
        loader = create_video_loader(src, train=False, batch_size=4, sequence_length=8, stride=2, step=8,
                                     crop_size=32, workers=2, dist=DistInfo(rank=rank, world_size=2),
                                     with_frame_num=True)
        assert loader.num_samples == len(ids)
        shard = []
        for _, labels, frame_num in loader:
            shard += [ids[(int(lbl), int(f))] for lbl, f in zip(labels, frame_num, strict=True)]
        seen.append(shard)
    assert abs(len(seen[0]) - len(seen[1])) <= 1
    assert_epoch_coverage(seen, len(ids))


def test_the_reader_and_its_clip_count_follow_the_codecs(tiny_video):
    """Shuffled H.264 on the GPU is read by the legacy fn.readers.video, which cuts a clip wherever the
    clip's span remains; VP9 (and the CPU) keep fn.experimental.readers.video, which needs
    ``sequence_length * stride`` frames. 32-frame files, 8 frames, stride 2, step 17: clips start at
    0 and 17 for the legacy reader (17 + 15 = 32), at 0 only for the experimental one."""
    pytest.importorskip("av")
    from crossdali.common.data.videos import ClipCounter, clip_reader, count_clips
    from crossdali.common.errors import DataError
    from crossdali.common.video import ClipTransform, resolve_video_source

    assert clip_reader("gpu", ["h264", "hevc"]) == "legacy"
    assert clip_reader("gpu", ["h264", "vp9"]) == clip_reader("cpu", ["h264"]) == clip_reader("gpu", []) == "experimental"
    assert clip_reader("gpu", ["h264"], shuffle=False) == "experimental"

    t = ClipTransform(sequence_length=8, stride=2, step=17)
    h264 = resolve_video_source(tiny_video / "h264", "val")
    vp9 = resolve_video_source(tiny_video, "val")
    assert count_clips(h264, device="gpu", transform=t) == (2 * len(h264.files), "legacy")
    # clips in file order (val) keep the experimental reader, faster there
    assert count_clips(h264, device="gpu", transform=t, shuffle=False) == (len(h264.files), "experimental")
    assert count_clips(vp9, device="cpu", transform=t) == (len(vp9.files), "experimental")
    # without validation the first file's codec picks the reader; the count is the file count
    assert count_clips(h264, device="gpu", transform=t, validate=False) == (len(h264.files), "legacy")
    # the loaders' count keeps the reader its number is for
    counter = ClipCounter(device="gpu", transform=t, shuffle=True, validate=True)
    assert (counter(h264), counter.reader) == (2 * len(h264.files), "legacy")
    assert (t.frames_needed_by("legacy"), t.frames_needed_by("experimental")) == (t.span, t.frames_needed) == (15, 16)
    with pytest.raises(DataError, match="h264"):  # the CPU cannot decode H.264: the file and the fix are named
        count_clips(h264, device="cpu", transform=t)


def test_default_pipelines_keep_the_gpu_decoders_busy():
    """``pipelines=None``: 1 on the CPU; on the GPU the largest divisor of the batch up to 14 in training,
    up to 7 for val."""
    from crossdali.common.video import default_video_pipelines

    batches = (1, 5, 8, 16, 28, 56, 64, 12)
    assert [default_video_pipelines("gpu", b) for b in batches] == [1, 5, 8, 8, 14, 14, 8, 12]
    assert [default_video_pipelines("gpu", b, train=False) for b in batches] == [1, 5, 4, 4, 7, 7, 4, 6]
    assert default_video_pipelines("cpu", 28) == 1
    # reads of several clips: DALI's batch is batch_size / clips_per_read reads
    assert [default_video_pipelines("gpu", b, clips_per_read=3) for b in (42, 84, 21, 48)] == [14, 14, 7, 8]
    assert default_video_pipelines("cpu", 42, clips_per_read=3) == 1
