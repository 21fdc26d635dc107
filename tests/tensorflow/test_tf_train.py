"""Keras training on DALI batches: beats chance by far, checkpoints (the last and the best), resumes,
evaluates."""

from __future__ import annotations

import shutil

import pytest

from crossdali.common.scripts.metrics import read_metrics

tf = pytest.importorskip("tensorflow")
pytest.importorskip("nvidia.dali.plugin.tf")

from crossdali.tensorflow.train_classification import create_model, get_args_parser, main  # noqa: E402

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]

# 11 classes: chance is 9.1 % top-1. A 4-layer CNN at 64x64 reaches 60-75 % on the tiny set in
# 10-12 epochs (measured: 60.0 / 67.3 % after 10 epochs with seeds 1 / 0, 74.5 % after these 12
# epochs with seed 0, about 12 s on 2 cores); 40 % leaves margin
# for the batch-norm jitter of a 55-image val set while staying > 4x chance.
THRESHOLD = 40.0
FAST = ["--sample-size", "tiny", "--arch", "small_cnn", "--crop-size", "64", "-b", "16", "--lr", "0.8",
        "--lr-warmup-epochs", "1", "-j", "2", "--print-freq", "0"]
BEST_FILES = [".data-00000-of-00001", ".index"]  # checkpoint_best.*: ckpt-N's files, copied


def test_training_beats_chance(data_root, tiny_classification, tmp_path, monkeypatch, assert_finished_run,
                               assert_best_checkpoint):
    monkeypatch.setenv("CROSSDALI_DATA", str(data_root))
    stats = main(get_args_parser().parse_args([*FAST, "--epochs", "12", "--output-dir", str(tmp_path)]))
    assert stats["val_samples"] == 55  # every val sample once
    assert stats["val_top1"] >= THRESHOLD, stats
    assert stats["train_samples"] == 264
    records = assert_finished_run(tmp_path, epochs=12, framework="tensorflow")
    epochs = [r for r in records if r["event"] == "epoch"]
    assert [r["epoch"] for r in epochs] == list(range(1, 13))
    assert {"train_img_s", "data_wait_s", "val_top1", "val_top5"} <= set(epochs[-1])
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"]

    # the best val top-1's weights: they load into a fresh model, and evaluate to that top-1
    meta = assert_best_checkpoint(tmp_path, framework="tensorflow", suffixes=BEST_FILES,
                                  config={"arch": "small_cnn", "epochs": 12, "crop_size": 64})
    fresh = create_model(meta["arch"], num_classes=meta["num_classes"], crop_size=meta["config"]["crop_size"])
    tf.train.Checkpoint(model=fresh).read(str(tmp_path / "checkpoint_best")).assert_existing_objects_matched().expect_partial()
    tested = main(get_args_parser().parse_args([*FAST, "--resume", str(tmp_path / "checkpoint_best"), "--test-only",
                                                "--output-dir", str(tmp_path / "test")]))
    assert tested["val_top1"] == meta["value"] and tested["val_samples"] == 55


def test_checkpoint_resume_and_test_only(data_root, tiny_classification, tmp_path, monkeypatch,
                                         assert_best_checkpoint):
    monkeypatch.setenv("CROSSDALI_DATA", str(data_root))
    out = tmp_path / "run"
    first = main(get_args_parser().parse_args([*FAST, "--epochs", "1", "--output-dir", str(out)]))
    assert tf.train.latest_checkpoint(str(out)).endswith("ckpt-1")
    # the restored weights give exactly the val numbers they were saved with
    tested = main(get_args_parser().parse_args([*FAST, "--resume", str(out), "--test-only"]))
    assert tested["val_top1"] == first["val_top1"] and tested["val_samples"] == 55
    assert tested["val_loss"] == pytest.approx(first["val_loss"], rel=1e-5)
    resumed = main(get_args_parser().parse_args([*FAST, "--epochs", "2", "--resume", str(out),
                                                 "--output-dir", str(out)]))
    assert resumed["train_samples"] == 264
    epochs = read_metrics(out)
    assert [r["epoch"] for r in epochs if r["event"] == "epoch"] == [1, 2]  # epoch 2 only after resume
    assert tf.train.latest_checkpoint(str(out)).endswith("ckpt-2")
    # the resumed run knows epoch 1's top-1: the best is epoch 2 only if it beat epoch 1
    assert_best_checkpoint(out, framework="tensorflow", suffixes=BEST_FILES, config={"arch": "small_cnn"})


def test_without_output_dir_the_run_gets_its_own_folder(data_root, tiny_classification, tmp_path, monkeypatch,
                                                        assert_finished_run):
    monkeypatch.setenv("CROSSDALI_DATA", str(data_root))
    monkeypatch.chdir(tmp_path)
    main(get_args_parser().parse_args([*FAST, "--epochs", "1", "--crop-size", "32"]))
    run_dir, = (tmp_path / "runs").glob("classification-tensorflow-small_cnn-*")
    assert_finished_run(run_dir, epochs=1, framework="tensorflow")
    assert tf.train.latest_checkpoint(str(run_dir)).endswith("ckpt-1")


def test_top5_is_left_out_with_five_classes_or_fewer(tiny_classification, tmp_path):
    """Top-5 of 3 classes is always 100 %: not reported (as in the PyTorch script)."""
    data = tmp_path / "three"
    for split in ("train", "val"):
        for folder in sorted((tiny_classification / "imagefolder" / split).iterdir())[:3]:
            shutil.copytree(folder, data / split / folder.name)
    stats = main(get_args_parser().parse_args([*FAST, "--data", str(data), "--epochs", "1", "--crop-size", "32",
                                               "--output-dir", str(tmp_path / "run")]))
    assert stats["val_samples"] == 15 and "val_top1" in stats and "val_top5" not in stats


def test_bad_resume_path_is_a_clear_error(data_root, tiny_classification, tmp_path, monkeypatch):
    monkeypatch.setenv("CROSSDALI_DATA", str(data_root))
    with pytest.raises(FileNotFoundError, match="no TensorFlow checkpoint there"):
        main(get_args_parser().parse_args([*FAST, "--epochs", "1", "--resume", str(tmp_path)]))


def test_multi_label_training_scores_map_and_keeps_the_best_by_it(data_root, tmp_path, monkeypatch):
    """--multi-label as in the other scripts: sigmoid + BCE on the multi-label sample set through the
    TensorFlow external-source loader, val mAP and macro F1, the best checkpoint by mAP (and
    --test-only on it gives that mAP again); a non-DALI backend is refused with exit 2."""
    import json

    from crossdali.common.data.sample_data import ensure_multilabel
    from crossdali.common.multilabel import read_multilabel_list
    from crossdali.common.scripts.script import run

    monkeypatch.setenv("CROSSDALI_DATA", str(data_root))
    root = ensure_multilabel(data_root, "tiny")
    args = [*FAST, "--multi-label", "--lr", "0.4"]
    stats = main(get_args_parser().parse_args([*args, "--epochs", "4", "--output-dir", str(tmp_path)]))
    assert stats["val_samples"] == 40 and {"val_map", "val_f1"} <= set(stats)
    maps = [r["val_map"] for r in read_metrics(tmp_path) if r["event"] == "epoch"]
    # a scorer that has learnt nothing gets each class's frequency as AP (18.2 % on this val set);
    # measured here (2-core CPU, small_cnn, seed 0): 24.0, 31.8, 45.6, 55.2 % after epochs 1-4
    chance = 100 * read_multilabel_list(root / "val.txt").label_matrix().mean()
    assert len(maps) == 4 and max(maps) > 1.3 * chance, maps
    meta = json.loads((tmp_path / "checkpoint_best.json").read_text())
    assert meta["metric"] == "val_map" and meta["value"] == max(maps)
    assert meta["class_names"] == list(read_multilabel_list(root / "train.txt").classes)
    tested = main(get_args_parser().parse_args([*args, "--resume", str(tmp_path / "checkpoint_best"), "--test-only",
                                                "--output-dir", str(tmp_path / "test")]))
    assert tested["val_map"] == pytest.approx(max(maps), abs=1e-3)
    with pytest.raises(SystemExit) as exit_info:
        run(main, get_args_parser(), [*args, "--data-backend", "native", "--output-dir", str(tmp_path / "n")])
    assert exit_info.value.code == 2


def test_xla_step_trains_like_the_graph_step(data_root, tiny_classification, tmp_path, monkeypatch):
    """``--jit-compile on`` (XLA, what auto picks on a GPU) against ``off``: the same weights and batches
    give the same first loss, and the next steps stay within rounding of each other (XLA fuses and
    reorders float sums; measured on 2 CPU cores: 0, 4e-6, 2e-4, 7e-4 relative over the first four
    steps, drifting to percents later at this learning rate)."""
    monkeypatch.setenv("CROSSDALI_DATA", str(data_root))
    losses, starts = {}, {}
    for mode in ("off", "on"):
        out = tmp_path / mode
        stats = main(get_args_parser().parse_args([*FAST, "--epochs", "1", "--jit-compile", mode,
                                                   "--output-dir", str(out)]))
        assert stats["train_samples"] == 264 and stats["val_samples"] == 55  # the partial last batch compiles too
        records = read_metrics(out)
        starts[mode] = next(r for r in records if r["event"] == "start")
        losses[mode] = [r["loss"] for r in records if r["event"] == "step"]
    assert starts["off"]["jit_compile"] is False and starts["on"]["jit_compile"] is True
    assert len(losses["on"]) == len(losses["off"]) == 17
    assert losses["on"][0] == pytest.approx(losses["off"][0], rel=1e-5)
    assert losses["on"][:4] == pytest.approx(losses["off"][:4], rel=1e-2)


def test_fetch_ahead_trains_on_the_same_batches(data_root, tiny_classification, tmp_path, monkeypatch):
    """``--fetch-ahead 1`` (a background thread fetches the batches) against the loop fetching them, and with
    the losses read in blocks (``--read-loss-every 4``), with DALI's buffers handed over through DLPack
    (``--handover dlpack``) and with the defaults (``auto``: DLPack; blocks of 8): the same batches in the same
    order, so the same step losses, every sample once, and the loader's epoch count right for the next epoch (the
    thread never reads past the epoch)."""
    monkeypatch.setenv("CROSSDALI_DATA", str(data_root))
    losses = {}
    one_by_one = ["--read-loss-every", "1", "--handover", "dataset"]
    for name, flags in {"0": ["--fetch-ahead", "0", *one_by_one], "1": ["--fetch-ahead", "1", *one_by_one],
                        "blocks": ["--fetch-ahead", "1", "--read-loss-every", "4", "--handover", "dataset"],
                        "dlpack": ["--handover", "dlpack", "--read-loss-every", "4"],
                        "default": []}.items():
        out = tmp_path / name
        stats = main(get_args_parser().parse_args([*FAST, "--epochs", "2", "--jit-compile", "off", *flags,
                                                   "--output-dir", str(out)]))
        assert stats["train_samples"] == 264 and stats["val_samples"] == 55
        records = read_metrics(out)
        start = next(r for r in records if r["event"] == "start")
        assert start["read_loss_every"] == {"0": 1, "1": 1, "default": 8}.get(name, 4)
        assert start["handover"] == ("dlpack" if name in ("dlpack", "default") else "dataset")  # auto: dlpack
        losses[name] = [r["loss"] for r in records if r["event"] == "step"]
    assert {len(v) for v in losses.values()} == {2 * 17}
    for name in ("1", "blocks", "dlpack", "default"):
        assert losses[name] == pytest.approx(losses["0"], rel=1e-4), name


@pytest.mark.parametrize("every", [1, 3])
def test_each_step_is_logged_with_its_own_loss_and_rate(tmp_path, every):
    """The loop reads a step's loss after launching the next step (so the GPU has it queued), or a block of
    ``every`` losses: each step record must still carry that step's own loss and learning rate, every step
    once, and the epoch's mean loss weighs each step by its samples."""
    from crossdali.common.scripts.metrics import MetricsWriter
    from crossdali.common.scripts.runs import StepLog
    from crossdali.tensorflow.distributed import init_distributed
    from crossdali.tensorflow.train_classification import train_one_epoch

    sizes = [4, 4, 4, 2]  # the last batch smaller, as at an epoch's end
    batches = [(tf.fill([n, 2, 2, 3], float(k)), tf.zeros([n], tf.int64)) for k, n in enumerate(sizes)]
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.1)
    seen_rates: list[float] = []

    def train_step(images, labels):  # the step's "loss" is its batch's fill value; it reads the rate it was given
        seen_rates.append(float(optimizer.learning_rate))
        return tf.reduce_mean(images)

    metrics = MetricsWriter(tmp_path)
    steps = StepLog(metrics, epoch=0, epochs=1, total=len(batches), enabled=False)
    stats = train_one_epoch(train_step, optimizer, batches, step0=10, schedule=lambda step: 0.01 * step,
                            runtime=init_distributed(engine="none"), steps=steps, read_loss_every=every)
    metrics.close()
    records = [r for r in read_metrics(tmp_path) if r["event"] == "step"]
    assert [r["loss"] for r in records] == [0.0, 1.0, 2.0, 3.0]
    assert [r["lr"] for r in records] == pytest.approx([0.10, 0.11, 0.12, 0.13])
    assert seen_rates == pytest.approx([0.10, 0.11, 0.12, 0.13])
    assert [r["samples"] for r in records] == sizes
    assert stats["train_samples"] == 14 and stats["train_loss"] == pytest.approx((0 * 4 + 4 + 8 + 3 * 2) / 14)
    assert all(r["step_s"] >= 0 for r in records)
