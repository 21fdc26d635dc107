"""The flax/optax training example on DALI batches: beats chance by far, checkpoints (the last and
the best), resumes the very same run (weights, optimizer and the train loader's DALI state),
evaluates."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("flax")
pytest.importorskip("optax")
pytest.importorskip("nvidia.dali.plugin.jax")

from crossdali.jax.train_classification import CHECKPOINT, get_args_parser, main  # noqa: E402

pytestmark = [pytest.mark.jax, pytest.mark.slow]

# 11 classes: chance is 9.1 % top-1. The 4-layer CNN at 64x64 reached 90.9 % after these 6 epochs
# (seed 0; 78.2 / 87.3 % after epochs 4 / 5), most of the time being XLA compilation (the run took
# 86 s on 2 cores shared at load 9, 27 s of CPU); 40 % leaves margin for the batch-norm jitter of
# a 55-image val set while staying > 4x chance. -b 24 divides the 264 train images: one
# train-step compilation.
THRESHOLD = 40.0
FAST = ["--sample-size", "tiny", "--arch", "small_cnn", "--crop-size", "64", "-b", "24", "--lr", "0.8",
        "--lr-warmup-epochs", "1", "-j", "2", "--print-freq", "0", "--data-backend", "dali-cpu"]


def test_training_beats_chance(data_root, tiny_classification, tmp_path, monkeypatch, assert_finished_run,
                               assert_best_checkpoint):
    monkeypatch.setenv("CROSSDALI_DATA", str(data_root))
    stats = main(get_args_parser().parse_args([*FAST, "--epochs", "6", "--output-dir", str(tmp_path)]))
    assert stats["val_samples"] == 55 and stats["train_samples"] == 264  # every sample once
    assert stats["val_top1"] >= THRESHOLD, stats
    records = assert_finished_run(tmp_path, epochs=6, framework="jax")
    assert records[0]["backend"] == "dali-cpu"
    epochs = [r for r in records if r["event"] == "epoch"]
    assert [r["epoch"] for r in epochs] == list(range(1, 7))
    assert {"train_img_s", "data_wait_s", "val_top1", "val_top5"} <= set(epochs[-1])
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"]
    # every step recorded once and in order, though each loss is read after the next step is dispatched,
    # with the loss the epoch's sum holds and the schedule's rate (computed on the host)
    steps = [r for r in records if r["event"] == "step"]
    assert [(r["epoch"], r["step"]) for r in steps] == [(e, k) for e in range(1, 7) for k in range(1, 12)]
    for epoch in epochs:
        mine = [r for r in steps if r["epoch"] == epoch["epoch"]]
        mean = sum(r["loss"] * r["samples"] for r in mine) / sum(r["samples"] for r in mine)
        assert mean == pytest.approx(epoch["train_loss"], rel=1e-5)
    assert steps[0]["lr"] == pytest.approx(0.1 * 0.8 * 24 / 256)  # the warm-up's first rate
    assert steps[-1]["lr"] < steps[11]["lr"]  # cosine decay after the warm-up epoch
    # the best val top-1's checkpoint, a copy of that epoch's checkpoint.msgpack: its weights give
    # exactly the val numbers they were saved with
    meta = assert_best_checkpoint(tmp_path, framework="jax", suffixes=[".msgpack"],
                                  config={"arch": "small_cnn", "epochs": 6, "crop_size": 64})
    tested = main(get_args_parser().parse_args([*FAST, "--resume", str(tmp_path / "checkpoint_best.msgpack"),
                                                "--test-only"]))
    assert tested["val_top1"] == meta["value"] and tested["val_samples"] == 55
    assert tested["val_loss"] == pytest.approx(meta["val"]["val_loss"], rel=1e-6)


def test_resume_continues_the_same_run(data_root, tiny_classification, tmp_path, monkeypatch):
    """A 2-epoch run killed after epoch 1 and resumed ends with the very weights of the
    uninterrupted run, because the checkpoint holds the optimizer state and the train loader's
    DALI state (the shuffle and augmentation of epoch 2)."""
    import flax.serialization

    from crossdali.jax import train_classification

    monkeypatch.setenv("CROSSDALI_DATA", str(data_root))
    args = [*FAST, "--crop-size", "32", "-b", "66", "--epochs", "2"]  # 4 full batches of 264: quick
    main(get_args_parser().parse_args([*args, "--output-dir", str(tmp_path / "straight")]))

    real, calls = train_classification.train_one_epoch, []

    def preempted(*a, **kw):  # the job is killed as its second epoch starts
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(train_classification, "train_one_epoch", preempted)
    with pytest.raises(KeyboardInterrupt):
        main(get_args_parser().parse_args([*args, "--output-dir", str(tmp_path / "split")]))
    monkeypatch.setattr(train_classification, "train_one_epoch", real)
    resumed = main(get_args_parser().parse_args([*args, "--resume", str(tmp_path / "split"),
                                                 "--output-dir", str(tmp_path / "split")]))
    assert resumed["train_samples"] == 264

    def params(run):
        saved = flax.serialization.msgpack_restore((tmp_path / run / CHECKPOINT).read_bytes())
        assert saved["epoch"] == 2
        return jax.tree_util.tree_leaves(saved["state"])

    for a, b in zip(params("straight"), params("split"), strict=True):
        np.testing.assert_array_equal(a, b)


def test_without_output_dir_the_run_gets_its_own_folder(data_root, tiny_classification, tmp_path, monkeypatch,
                                                        assert_finished_run):
    monkeypatch.setenv("CROSSDALI_DATA", str(data_root))
    monkeypatch.chdir(tmp_path)
    main(get_args_parser().parse_args([*FAST, "--epochs", "1", "--crop-size", "32"]))
    run_dir, = (tmp_path / "runs").glob("classification-jax-small_cnn-*")
    assert_finished_run(run_dir, epochs=1, framework="jax")
    assert (run_dir / CHECKPOINT).is_file()


def test_top5_is_left_out_with_five_classes_or_fewer(tiny_classification, tmp_path):
    """Top-5 of 3 classes is always 100 %: not reported (as in the PyTorch script)."""
    data = tmp_path / "three"
    for split in ("train", "val"):
        for folder in sorted((tiny_classification / "imagefolder" / split).iterdir())[:3]:
            shutil.copytree(folder, data / split / folder.name)
    stats = main(get_args_parser().parse_args([*FAST, "--data", str(data), "--epochs", "1", "--crop-size", "32",
                                               "--output-dir", str(tmp_path / "run")]))
    assert stats["val_samples"] == 15 and "val_top1" in stats and "val_top5" not in stats


def test_bad_resume_path_and_arch_are_clear_errors(data_root, tiny_classification, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CROSSDALI_DATA", str(data_root))
    with pytest.raises(FileNotFoundError, match="no checkpoint there"):
        main(get_args_parser().parse_args([*FAST, "--epochs", "1", "--resume", str(tmp_path)]))
    with pytest.raises(SystemExit) as e:  # refused by argparse, before any data is read
        get_args_parser().parse_args([*FAST, "--epochs", "1", "--arch", "vgg"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --arch: unknown model 'vgg' (`crossdali models --framework jax` lists them)" in err


def test_multi_label_training_scores_map_and_keeps_the_best_by_it(data_root, tmp_path, monkeypatch):
    """--multi-label as in the PyTorch script: sigmoid + BCE on the multi-label sample set, val mAP
    and macro F1 each epoch, the best checkpoint chosen by mAP; synthetic data is refused."""
    import json

    from crossdali.common.data.sample_data import ensure_multilabel
    from crossdali.common.multilabel import read_multilabel_list
    from crossdali.common.scripts.script import run

    monkeypatch.setenv("CROSSDALI_DATA", str(data_root))
    root = ensure_multilabel(data_root, "tiny")
    args = [*FAST, "--multi-label", "--epochs", "4", "-b", "16", "--lr", "0.4"]
    stats = main(get_args_parser().parse_args([*args, "--output-dir", str(tmp_path)]))
    assert stats["val_samples"] == 40 and {"val_map", "val_f1"} <= set(stats)
    epochs = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    maps = [r["val_map"] for r in epochs if r.get("event") == "epoch"]
    # a scorer that has learnt nothing gets each class's frequency as AP (18.2 % on this val set);
    # measured here (2-core CPU, seed 0): 27.7, 45.4, 59.2, 57.9 % after epochs 1-4
    chance = 100 * read_multilabel_list(root / "val.txt").label_matrix().mean()
    assert len(maps) == 4 and max(maps) > 1.3 * chance, maps
    meta = json.loads((tmp_path / "checkpoint_best.json").read_text())
    assert meta["metric"] == "val_map" and meta["value"] == max(maps)
    assert meta["class_names"] == list(read_multilabel_list(root / "train.txt").classes)
    with pytest.raises(SystemExit) as exit_info:
        run(main, get_args_parser(), [*args, "--data-backend", "synthetic", "--output-dir", str(tmp_path / "s")])
    assert exit_info.value.code == 2
