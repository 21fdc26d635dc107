"""``clips_per_read``: consecutive clips decoded as one read and handed out as separate clips. On the
real VP9 sample clips (DALI on the CPU) and, marked gpu, the H.264 copies through NVDEC's legacy reader:
the clips are the very ones read one at a time (same frames, same pixels), an epoch holds each once,
``len()`` and ``num_samples`` count clips, and the mistakes are named."""

from __future__ import annotations

import logging

import numpy as np
import pytest

# the crop window is the whole (square) frame and nothing is mirrored, so a clip's pixels depend only on
# its frames: a clip cut from a read must equal the same clip read alone
_FIXED = dict(sequence_length=4, stride=2, crop_size=32, random_area=(1.0, 1.0), random_aspect_ratio=(1.0, 1.0),
              hflip=0.0, output_layout="FHWC")


def _indexed(src):
    """``src`` with each file labelled by its index, so (label, first frame) names a clip."""
    from crossdali.common.data.sources import DataSource

    return DataSource(format="filelist", root=src.root, files=src.files, labels=tuple(range(len(src.files))),
                      num_samples=len(src.files))


def _clips(src, *, clips_per_read: int, device: str = "cpu", reader: str | None = None) -> dict:
    """{(file index, first frame): clip} over one training epoch of the shared clip pipeline."""
    from crossdali.common.options import PipelineOptions
    from crossdali.common.video import VIDEO_READER_NAME, ClipTransform, create_clip_pipeline

    t = ClipTransform(**_FIXED, clips_per_read=clips_per_read)
    opts = PipelineOptions(batch_size=2, num_threads=2, device=device, device_id=0 if device == "gpu" else None)
    pipe = create_clip_pipeline(src, train=True, options=opts, transform=t, with_frame_num=True, reader=reader)
    pipe.build()
    reads = pipe.epoch_size(VIDEO_READER_NAME)
    out: dict = {}
    for _ in range(-(-reads // 2)):
        clips, labels, frames = (x.as_cpu() if device == "gpu" else x for x in pipe.run())
        for c, lbl, f in zip(clips.as_array(), labels.as_array(), frames.as_array(), strict=True):
            # one sample is one read: (k, F, H, W, C) clips, k labels, k first frames (a clip alone: F, H, W, C)
            c = c[None] if clips_per_read == 1 else c
            assert c.shape == (clips_per_read, 4, 32, 32, 3) and lbl.shape == f.shape == (clips_per_read,)
            assert (lbl == lbl[0]).all() and (np.diff(f) == 8).all()  # consecutive clips of one file
            for clip, label, first in zip(c, lbl, f, strict=True):
                key = (int(label), int(first))
                assert key not in out or np.array_equal(out[key], clip)  # the padded last batch repeats a read
                out[key] = clip
    return out


def _expected(src, *, clips_per_read: int, need, device: str = "cpu") -> set:
    """(file index, first frame) of every clip: reads of ``clips_per_read`` 8-frame clips every ``8 * k`` frames."""
    from crossdali.common.data.videos import check_videos

    step = 8 * clips_per_read
    return {(i, s + j * 8) for i, info in enumerate(check_videos(src.files, device=device))
            for s in range(0, info.num_frames - need(clips_per_read) + 1, step) for j in range(clips_per_read)}


def test_a_read_of_three_clips_gives_the_clips_read_one_at_a_time(tiny_video):
    from crossdali.common.video import resolve_video_source

    src = _indexed(resolve_video_source(tiny_video, "val"))
    single, grouped = _clips(src, clips_per_read=1), _clips(src, clips_per_read=3)
    # the experimental reader (CPU) needs sequence_length x stride frames from a read's start
    assert set(grouped) == _expected(src, clips_per_read=3, need=lambda k: 8 * k)
    assert set(single) == _expected(src, clips_per_read=1, need=lambda k: 8 * k)
    assert set(grouped) < set(single)  # the 32-frame files end with one clip that fills no read of 3
    for key, clip in grouped.items():
        np.testing.assert_array_equal(clip, single[key], err_msg=str(key))


def _windows(src, *, clips_per_read: int, seed: int) -> dict:
    """{(file index, first frame): (x, y, mirrored)} of every training clip of an epoch: each clip found as a
    32x32 window (a quarter of the 64x64 frame, so the crop is not rescaled) of its full frames, one window
    and one mirror for all of its frames, pixel for pixel."""
    from crossdali.common.options import PipelineOptions
    from crossdali.common.video import VIDEO_READER_NAME, ClipTransform, create_clip_pipeline

    def epoch(k, *, crop, area, hflip):
        t = ClipTransform(sequence_length=4, stride=2, crop_size=crop, random_area=(area, area), hflip=hflip,
                          random_aspect_ratio=(1.0, 1.0), output_layout="FHWC", mean=(0, 0, 0), std=(1, 1, 1),
                          clips_per_read=k)
        opts = PipelineOptions(batch_size=2, num_threads=2, device="cpu", device_id=None, seed=seed)
        pipe = create_clip_pipeline(src, train=True, options=opts, transform=t, with_frame_num=True)
        pipe.build()
        reads = []
        for _ in range(-(-pipe.epoch_size(VIDEO_READER_NAME) // 2)):
            clips, labels, frames = pipe.run()
            for c, lbl, f in zip(clips.as_array(), labels.as_array(), frames.as_array(), strict=True):
                keys = [(int(a), int(b)) for a, b in zip(np.atleast_1d(lbl), np.atleast_1d(f), strict=True)]
                reads.append(dict(zip(keys, c[None] if k == 1 else c, strict=True)))
        return reads

    full = {key: clip for read in epoch(1, crop=64, area=1.0, hflip=0.0) for key, clip in read.items()}
    out = []
    for read in epoch(clips_per_read, crop=32, area=0.25, hflip=0.5):
        found = {}
        for key, clip in read.items():
            frames = full[key].astype(np.float32)
            err, x, y, m = min((float(np.abs(clip - (w[:, :, ::-1] if m else w)).max()), x, y, m)
                               for x in range(33) for y in range(33) for m in (False, True)
                               for w in [frames[:, y:y + 32, x:x + 32]])
            assert err < 0.5, (key, err)  # all of the clip's frames: one window, one mirror
            found[key] = (x, y, m)
        out.append(found)
    return out


def test_each_clip_of_a_read_gets_its_own_crop_and_flip(tiny_video):
    """Reads of 3 clips: every clip is one crop window and one mirror of its own frames (the same for all of
    them), the windows and flips differ between the clips of a read, each clip of the epoch comes once, and
    the same seed draws the same ones."""
    from crossdali.common.video import resolve_video_source

    val = _indexed(resolve_video_source(tiny_video, "val"))
    src = type(val)(format="filelist", root=val.root, files=val.files[:8], labels=val.labels[:8], num_samples=8)
    reads = _windows(src, clips_per_read=3, seed=3)
    keys = [key for read in reads for key in read]
    assert set(keys) == _expected(src, clips_per_read=3, need=lambda k: 8 * k)
    assert len(reads) == 8  # one read per file: the padded last step repeats none here
    assert all(len(set(read.values())) == 3 for read in reads)  # three different windows per read
    flips = [{m for _, _, m in read.values()} for read in reads]
    assert sum(len(f) == 2 for f in flips) >= 3  # mirrored and not inside one read
    assert _windows(src, clips_per_read=3, seed=3) == reads


def _loader(data, **kw):
    from crossdali.pytorch.video import create_video_loader

    args = dict(train=True, batch_size=6, sequence_length=4, stride=2, crop_size=32, workers=1, with_frame_num=True,
                clips_per_read=3)
    return create_video_loader(data, **(args | kw))


def test_the_loader_hands_out_clips_and_counts_them(tiny_video, caplog):
    """Batches of 6 clips (2 reads of 3), labels and first frames per clip, every clip of the epoch once,
    ``len()`` exact; the clips no read covers are counted in a warning, not dropped silently."""
    torch = pytest.importorskip("torch")
    from crossdali.common.video import resolve_video_source

    src = _indexed(resolve_video_source(tiny_video, "val"))
    with caplog.at_level(logging.WARNING, logger="crossdali.common.data.videos"):
        loader = _loader(src, last_batch="partial")
    assert any("clips_per_read=3 gives" in r.getMessage() and "are not read" in r.getMessage() for r in caplog.records)
    expected = _expected(src, clips_per_read=3, need=lambda k: 8 * k)
    assert loader.num_samples == len(expected) and loader.batch_size == 6
    seen, batches = [], 0
    for clips, labels, frames in loader:
        assert clips.dtype == torch.float32 and tuple(clips.shape[1:]) == (3, 4, 32, 32)
        assert clips.shape[0] == labels.shape[0] == frames.shape[0] and clips.shape[0] % 3 == 0
        seen += [(int(lbl), int(f)) for lbl, f in zip(labels, frames, strict=True)]
        batches += 1
    assert batches == len(loader)
    assert sorted(seen) == sorted(expected)  # each clip once


def test_a_mid_epoch_state_resumes_only_with_the_same_clips_per_read(tiny_video):
    from crossdali.common.errors import UsageError

    whole = [(c.numpy(), f.numpy()) for c, _, f in _loader(tiny_video)]
    first = _loader(tiny_video)
    it = iter(first)
    next(it)
    state = first.state_dict()
    assert state["unfold"] == 3
    resumed = _loader(tiny_video)
    resumed.load_state_dict(state)
    rest = [(c.numpy(), f.numpy()) for c, _, f in resumed]
    assert len(rest) == len(whole) - 1
    for (c0, f0), (c1, f1) in zip(whole[1:], rest, strict=True):
        np.testing.assert_array_equal(f0, f1)
        np.testing.assert_array_equal(c0, c1)
    other = _loader(tiny_video, clips_per_read=2, batch_size=4)
    with pytest.raises(UsageError, match=r"saved reading 3 clip\(s\) at a time.*--clips-per-read 3"):
        other.load_state_dict(state)


def test_mistakes_are_named(tiny_video):
    from crossdali.common.errors import UsageError

    with pytest.raises(UsageError, match=r"batch size 7 is not a multiple of clips_per_read \(--clips-per-read\) 3"):
        _loader(tiny_video, batch_size=7)
    with pytest.raises(UsageError, match="is for training"):
        _loader(tiny_video, train=False)
    with pytest.raises(UsageError, match=r"3 reads .* pipelines=2 \(--pipelines\) cannot share"):
        _loader(tiny_video, batch_size=9, pipelines=2)
    with pytest.raises(ValueError, match="step must be sequence_length \\* stride"):
        _loader(tiny_video, step=4)


def test_a_file_too_short_for_one_read_is_named_not_skipped(tiny_video):
    """A file long enough for a clip but not for a read would give no clip: the check names it and the flag."""
    from crossdali.common.data.videos import check_videos
    from crossdali.common.errors import DataError
    from crossdali.common.video import ClipTransform

    files = sorted(str(f) for f in (tiny_video / "index").glob("count_40*.webm"))
    t = ClipTransform(sequence_length=8, stride=2)
    assert check_videos(files, device="cpu", transform=t)  # 40 frames hold 16-frame clips
    with pytest.raises(DataError, match=r"count_40.*has 40 frames but a read of clips_per_read=3 clips needs 48.*"
                                        r"Lower --clips-per-read"):
        check_videos(files, device="cpu", transform=ClipTransform(sequence_length=8, stride=2, clips_per_read=3))


def test_the_training_script_refuses_a_batch_that_is_not_whole_reads(tiny_video, tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "crossdali.video.train", "--data", str(tiny_video),
                           "--data-backend", "dali-cpu", "--batch-size", "8", "--clips-per-read", "3",
                           "--epochs", "1", "--output-dir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert "batch size 8 is not a multiple of clips_per_read (--clips-per-read) 3" in lines[-1]
    assert "Traceback" not in proc.stderr


def test_key_frames_further_apart_than_clips_get_a_hint_naming_clips_per_read(tmp_path, caplog):
    """H.264 with a key frame every 16 frames and 4-frame clips: the probe reads the interval, and a loader
    on NVDEC's legacy reader (shuffled clips on the GPU; counted here without one) is told that reads of 4
    clips decode each interval once; with clips_per_read=4, or key frames at every clip, it is not."""
    from crossdali.common.data.sample_data.video import write_video
    from crossdali.common.data.sources import DataSource
    from crossdali.common.data.videos import count_clips, probe_video
    from crossdali.common.video import ClipTransform

    frames = np.random.default_rng(0).integers(0, 255, (48, 64, 64, 3), dtype=np.uint8)
    files = []
    for gop in (16, 4):
        path = write_video(tmp_path / f"gop{gop}.mp4", frames, codec="h264",
                           options={"g": str(gop), "keyint_min": str(gop), "sc_threshold": "0"})
        assert probe_video(path).key_frame_interval == gop
        files.append(str(path))

    def hints(path, **kw) -> list[str]:
        caplog.clear()
        src = DataSource(format="filelist", root=tmp_path, files=(path,), labels=(0,), num_samples=1)
        with caplog.at_level(logging.WARNING, logger="crossdali.common.data.videos"):
            assert count_clips(src, device="gpu", transform=ClipTransform(sequence_length=4, **kw))[1] == "legacy"
        return [r.getMessage() for r in caplog.records if "--clips-per-read" in r.getMessage()]

    (hint,) = hints(files[0])
    assert "a key frame every 16 frames (median) and a clip starts every 4" in hint
    assert "clips_per_read=4 (--clips-per-read 4)" in hint and "--key-every 4" in hint
    assert hints(files[0], clips_per_read=4) == [] and hints(files[1]) == []


@pytest.mark.gpu
def test_gpu_legacy_reader_reads_give_the_clips_read_one_at_a_time(gpu_video):
    """NVDEC's legacy reader (shuffled H.264): reads of 2 clips give the same frames as clips read one
    at a time, to within the decoder's rounding, and every clip of the 2-clip grid once."""
    from nvidia.dali.backend import GetCUDADeviceCount

    if GetCUDADeviceCount() == 0:
        pytest.skip("needs a CUDA GPU (NVDEC); none is visible on this machine")
    from crossdali.common.video import resolve_video_source

    src = _indexed(resolve_video_source(gpu_video / "h264", "val"))
    single = _clips(src, clips_per_read=1, device="gpu", reader="legacy")
    grouped = _clips(src, clips_per_read=2, device="gpu", reader="legacy")
    # the legacy reader needs a read's span, (sequence_length - 1) x stride + 1 frames
    assert set(grouped) == _expected(src, clips_per_read=2, need=lambda k: (4 * k - 1) * 2 + 1, device="gpu")
    for key, clip in grouped.items():
        diff = np.abs(clip.astype(np.float32) - single[key].astype(np.float32))
        assert float(diff.mean()) < 0.05, (key, float(diff.mean()))


def test_the_default_reads_three_clips_where_the_batch_and_the_files_allow(tiny_video):
    """``clips_per_read=None``: 3 in training; 2 or 1 where the batch does not split into reads of 3 or the
    32-frame files hold no read of 3 (16-frame clips); 1 for val and for clips that do not touch."""
    from crossdali.common.video import DEFAULT_CLIPS_PER_READ, ClipTransform, default_clips_per_read

    assert DEFAULT_CLIPS_PER_READ == 3
    t = ClipTransform(sequence_length=8, stride=2)
    assert default_clips_per_read(24, train=True, transform=t) == 3
    assert default_clips_per_read(16, train=True, transform=t) == 2
    assert default_clips_per_read(7, train=True, transform=t) == 1
    assert default_clips_per_read(24, train=True, transform=t, num_frames=[48, 100]) == 3
    assert default_clips_per_read(24, train=True, transform=t, num_frames=[47, 100]) == 2
    assert default_clips_per_read(24, train=True, transform=t, pipelines=12) == 2  # 12 reads split over 12, 8 do not
    assert default_clips_per_read(24, train=False, transform=t) == 1
    assert default_clips_per_read(24, train=True, transform=ClipTransform(sequence_length=8, stride=2, step=8)) == 1
    for kw, k in ((dict(batch_size=6, sequence_length=4), 3), (dict(batch_size=6, sequence_length=8), 2),
                  (dict(batch_size=6, sequence_length=4, train=False, last_batch=None), 1)):
        loader = _loader(tiny_video, **(kw | {"clips_per_read": None}))
        assert loader.unfold == k, kw
