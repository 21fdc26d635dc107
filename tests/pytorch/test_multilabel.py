"""Multi-label classification from list files: the reader, the sample set, the loader (real DALI on
the composite JPEGs, multi-hot labels, every sample once over shards) and --multi-label training."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from crossdali.common.distributed import DistInfo
from crossdali.common.errors import DataError
from crossdali.common.multilabel import multilabel_metrics, read_multilabel_list
from crossdali.pytorch.multilabel import create_multilabel_loader


@pytest.fixture(scope="module")
def multilabel_root(data_root):
    from crossdali.common.data.sample_data import ensure_multilabel

    return ensure_multilabel(data_root, "tiny")


def test_sample_set_images_carry_one_to_three_labels(multilabel_root):
    train = read_multilabel_list(multilabel_root / "train.txt")
    assert train.num_samples == 96 and train.num_classes == 11
    counts = train.label_matrix().sum(axis=1)
    assert set(counts.tolist()) == {1.0, 2.0, 3.0}  # every size of label set occurs
    assert train.classes == tuple((multilabel_root / "classes.txt").read_text().split())


def test_list_formats_names_indices_csv_and_errors(tmp_path, multilabel_root):
    img = sorted((multilabel_root / "images" / "val").glob("*.jpg"))[:3]
    (tmp_path / "a.txt").write_text(f"{img[0]} cat dog\n# a comment\n{img[1]}\n{img[2]} dog dog\n")
    src = read_multilabel_list(tmp_path / "a.txt")
    assert src.classes == ("cat", "dog") and src.labels == ((0, 1), (), (1,))  # sorted names, no labels, deduplicated
    (tmp_path / "b.csv").write_text(f"path,labels\n{img[0]},3 7\n{img[1]},0\n")
    src = read_multilabel_list(tmp_path / "b.csv")
    assert src.num_classes == 8 and src.labels == ((3, 7), (0,))  # integer labels: classes 0..max
    (tmp_path / "classes.txt").write_text("cat\ndog\n")
    (tmp_path / "c.txt").write_text(f"{img[0]} cat bird\n")
    with pytest.raises(DataError, match=r"c\.txt:1: label 'bird' is not one of the 2 classes in .*classes\.txt"):
        read_multilabel_list(tmp_path / "c.txt")
    (tmp_path / "d.txt").write_text(f"{img[0]} cat\nmissing.jpg dog\n")
    with pytest.raises(DataError, match=r"d\.txt:2: .*missing\.jpg does not exist"):
        read_multilabel_list(tmp_path / "d.txt")
    (tmp_path / "exclude.txt").write_text(f"{tmp_path / 'missing.jpg'}\n")  # an exclusion list leaves it out
    src = read_multilabel_list(tmp_path / "d.txt", exclude=tmp_path / "exclude.txt")
    assert src.files == (str(img[0]),) and src.labels == ((0,),)


def test_loader_gives_multi_hot_labels_in_list_order(multilabel_root):
    source = read_multilabel_list(multilabel_root / "val.txt")
    loader = create_multilabel_loader(source, train=False, batch_size=16, crop_size=32, workers=1, py_workers=1)
    images, labels = zip(*loader)
    images, labels = torch.cat(images), torch.cat(labels)
    assert images.shape == (40, 3, 32, 32) and images.dtype == torch.float32 and images.std() > 0.1
    assert labels.dtype == torch.float32 and labels.shape == (40, 11)
    np.testing.assert_array_equal(labels.numpy(), source.label_matrix())  # val: the list's order, exact labels
    last = create_multilabel_loader(source, train=False, batch_size=16, crop_size=32, workers=1, py_workers=1,
                                    channels_last=True)  # what --channels-last asks for: the same images
    for (a, _), b in zip(last, images.split(16), strict=True):
        assert a.is_contiguous(memory_format=torch.channels_last) and torch.equal(a, b)


def test_train_epochs_cover_every_sample_once_over_shards(multilabel_root):
    source = read_multilabel_list(multilabel_root / "train.txt")
    # each image's label set is a fingerprint; with 96 images, count them over two shards and two epochs
    want = sorted(map(tuple, source.label_matrix().astype(int).tolist()))
    for epoch in range(2):
        got = []
        for rank in range(2):
            loader = create_multilabel_loader(source, train=True, batch_size=8, crop_size=16, workers=1,
                                              py_workers=0, seed=3, dist=DistInfo(rank, 2, rank, "test"),
                                              checkpointing=False)
            for _ in range(epoch + 1):
                batches = [lab for _, lab in loader]
            got += [tuple(row) for lab in batches for row in lab.int().tolist()]
        assert sorted(got) == want


def test_metrics_against_hand_computed_values():
    targets = np.array([[1, 0], [0, 1], [1, 1], [0, 0]], dtype=np.float32)
    scores = np.array([[0.9, 0.2], [0.6, 0.7], [0.8, 0.4], [0.1, 0.1]], dtype=np.float32)
    m = multilabel_metrics(scores, targets)
    # class 0: positives ranked 1st and 2nd -> AP 1; class 1: positives at ranks 1 and 2 (0.7, 0.4) -> AP 1
    assert m["map"] == pytest.approx(100.0)
    # at 0.5: class 0 predicts rows 0,1,2 (tp 2, fp 1) F1 0.8; class 1 predicts row 1 (tp 1, fn 1) F1 2/3
    assert m["f1"] == pytest.approx(100 * (0.8 + 2 / 3) / 2)


@pytest.mark.slow
def test_multi_label_training_learns(tmp_path, multilabel_root):
    from crossdali.common.scripts.metrics import read_metrics
    from crossdali.pytorch import train_classification

    torch.manual_seed(0)
    args = train_classification.get_args_parser().parse_args([
        "--multi-label", "--data", str(multilabel_root), "--arch", "resnet18", "--crop-size", "64", "-b", "16",
        "--epochs", "3", "--lr", "0.1", "--lr-warmup-epochs", "0", "-j", "2", "--output-dir", str(tmp_path / "run"),
        "--print-freq", "0"])
    stats = train_classification.main(args)
    assert stats["val_samples"] == 40
    epochs = [r for r in read_metrics(tmp_path / "run") if r.get("event") == "epoch"]
    assert len(epochs) == 3 and all("val_map" in r and "val_f1" in r for r in epochs)
    # A scorer that has learnt nothing gets each class's frequency as AP: 18.2 % on this val set.
    # Measured here (2-core CPU): 26.6, 29.3, 29.1 % after epochs 1-3 (ResNet-18 from scratch, 96 images).
    chance = 100 * read_multilabel_list(multilabel_root / "val.txt").label_matrix().mean()
    assert max(r["val_map"] for r in epochs) > 1.3 * chance, [r["val_map"] for r in epochs]
    ckpt = torch.load(tmp_path / "run" / "checkpoint_best.pth", weights_only=True)
    assert ckpt["multi_label"] is True and ckpt["class_names"] == list(read_multilabel_list(
        multilabel_root / "train.txt").classes)
    assert (tmp_path / "run" / "curves.png").is_file()


def test_native_backend_is_refused_with_the_fix(multilabel_root, capsys):
    from crossdali.common.scripts.script import run
    from crossdali.pytorch import train_classification

    with pytest.raises(SystemExit) as exit_info:
        run(train_classification.main, train_classification.get_args_parser(),
            ["--multi-label", "--data", str(multilabel_root), "--data-backend", "native", "--epochs", "1"])
    assert exit_info.value.code == 2
    assert "--multi-label reads its lists through DALI: use --data-backend dali-cpu or dali-gpu" in capsys.readouterr().err
