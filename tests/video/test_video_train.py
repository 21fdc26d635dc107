"""A short training run on the tiny sample clips beats chance (25 %) by a wide margin; its best
checkpoint evaluates to the same top-1 with --test-only."""

from __future__ import annotations

import pytest

from crossdali.common.scripts.metrics import read_metrics

#: Chance is 25 % (4 balanced classes). 60 % on 40 val clips is beyond any luck (p < 1e-6 for a
#: guesser) and is reached after about 5 epochs; 6 epochs measured 82.5 % here.
MIN_VAL_TOP1 = 60.0


@pytest.mark.slow
def test_video_training_beats_chance(tiny_video, tmp_path):
    pytest.importorskip("torch")
    from crossdali.video.train import get_args_parser, main

    args = get_args_parser().parse_args([
        "--data", str(tiny_video), "--data-backend", "dali-cpu", "--epochs", "6", "-b", "16",
        "--clip-len", "8", "--frame-stride", "2", "--crop-size", "56", "-j", "2", "--engine", "none",
        "--output-dir", str(tmp_path)])
    stats = main(args)
    assert stats["val_samples"] == 40  # 20 val files x 2 clips, each once
    assert stats["val_top1"] >= MIN_VAL_TOP1, stats
    records = read_metrics(tmp_path)
    epochs = [r for r in records if r["event"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [1, 2, 3, 4, 5, 6]
    assert all("val_top5" not in r for r in epochs)  # 4 classes: top-5 would always be 100 %
    assert (tmp_path / "checkpoint_last.pth").is_file() and (tmp_path / "curves.png").is_file()

    best = max(epochs, key=lambda r: r["val_top1"])
    test = main(get_args_parser().parse_args([
        "--data", str(tiny_video), "--data-backend", "dali-cpu", "-b", "16", "--clip-len", "8", "--frame-stride", "2",
        "--crop-size", "56", "-j", "2", "--engine", "none", "--resume", str(tmp_path / "checkpoint_best.pth"),
        "--test-only", "--output-dir", str(tmp_path / "test")]))
    assert test["val_top1"] == best["val_top1"] and test["val_samples"] == 40


@pytest.mark.gpu
def test_video_training_with_float16_on_cuda(gpu_video, tmp_path):
    """--amp on CUDA: float16 autocast with loss scaling (the video script used to skip the
    scaler, so small gradients underflowed); the run trains and its loss falls."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (NVDEC, float16 autocast)")
    from crossdali.video.train import get_args_parser, main

    stats = main(get_args_parser().parse_args([
        "--data", str(gpu_video), "--data-backend", "dali-gpu", "--amp", "--epochs", "3", "-b", "8", "--clip-len", "8",
        "--frame-stride", "2", "--crop-size", "112", "-j", "2", "--engine", "none", "--output-dir", str(tmp_path)]))
    epochs = read_metrics(tmp_path)
    epochs = [r for r in epochs if r["event"] == "epoch"]
    assert stats["val_samples"] > 0 and epochs[-1]["train_loss"] < epochs[0]["train_loss"], epochs
    ckpt = torch.load(tmp_path / "checkpoint_last.pth", weights_only=True)
    assert ckpt["scaler"]["scale"] > 1  # the GradScaler was on


def test_video_training_reads_several_clips_at_a_time(tiny_video, tmp_path):
    """--clips-per-read 3: the script trains on clips cut from 3-clip reads (every clip of the 3-clip grid
    once in the epoch: 3 of each 32-frame file's 4), validates on every val clip once, and records the setting."""
    pytest.importorskip("torch")
    from crossdali.common.data.videos import check_videos, clips_per_epoch
    from crossdali.common.video import ClipTransform, resolve_video_source
    from crossdali.video.train import get_args_parser, main

    stats = main(get_args_parser().parse_args([
        "--data", str(tiny_video), "--data-backend", "dali-cpu", "--epochs", "1", "-b", "6", "--clips-per-read", "3",
        "--clip-len", "4", "--frame-stride", "2", "--crop-size", "32", "-j", "2", "--engine", "none",
        "--output-dir", str(tmp_path)]))
    records = read_metrics(tmp_path)
    start = next(r for r in records if r["event"] == "start")
    epoch = next(r for r in records if r["event"] == "epoch")
    assert start["clips_per_read"] == 3
    infos = check_videos(resolve_video_source(tiny_video, "train").files, device="cpu")
    grid = clips_per_epoch(infos, ClipTransform(sequence_length=4, stride=2, clips_per_read=3))
    assert grid * 4 == clips_per_epoch(infos, ClipTransform(sequence_length=4, stride=2)) * 3  # 3 of 4 clips a file
    assert epoch["train_samples"] == grid, epoch
    assert stats["val_samples"] == 20 * 4  # val: 20 files x 4 clips, one at a time


@pytest.mark.gpu
def test_video_training_reads_several_h264_clips_at_a_time_on_cuda(gpu_video, tmp_path):
    """--clips-per-read 2 on NVDEC's legacy reader (H.264, shuffled), training's default pipelines: the
    epoch holds every clip of the 2-clip grid once, and the run trains."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (NVDEC)")
    from crossdali.common.data.videos import check_videos, clips_per_epoch
    from crossdali.common.video import ClipTransform, resolve_video_source
    from crossdali.video.train import get_args_parser, main

    data = gpu_video / "h264"
    main(get_args_parser().parse_args([
        "--data", str(data), "--data-backend", "dali-gpu", "--amp", "--epochs", "2", "-b", "8", "--clip-len", "8",
        "--frame-stride", "2", "--clips-per-read", "2", "--crop-size", "112", "-j", "2", "--engine", "none",
        "--output-dir", str(tmp_path)]))
    records = read_metrics(tmp_path)
    start = next(r for r in records if r["event"] == "start")
    epochs = [r for r in records if r["event"] == "epoch"]
    assert start["clips_per_read"] == 2 and start["pipelines"] == 4  # 8 clips = 4 reads a step, one per pipeline
    infos = check_videos(resolve_video_source(data, "train").files, device="gpu")
    grid = clips_per_epoch(infos, ClipTransform(sequence_length=8, stride=2, clips_per_read=2), reader="legacy")
    assert [r["train_samples"] for r in epochs] == [grid, grid] and all(r["val_samples"] > 0 for r in epochs)
