"""The PyTorch detection loaders (CPU): DALI and native batches, exactly-once val over shards,
DALI val vs torchvision val."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from crossdali.common.distributed import DistInfo  # noqa: E402
from crossdali.pytorch.detection import create_detection_loader  # noqa: E402


@pytest.mark.parametrize("backend", ["dali-cpu", "native"])
def test_train_batches(detection_root, backend):
    loader = create_detection_loader(detection_root, train=True, backend=backend, batch_size=8, workers=2)
    assert len(loader) == 12 and loader.num_classes == 5
    images, offsets, labels = next(iter(loader))
    assert images.shape == (8, 3, 300, 300) and images.dtype == torch.float32
    assert offsets.shape == (8, 8732, 4) and labels.shape == (8, 8732) and labels.dtype == torch.int64
    assert 0 <= int(labels.min()) and int(labels.max()) <= 5
    assert (labels > 0).sum() > 0  # boxes matched to anchors
    assert torch.isfinite(offsets).all()
    # normalized with the ImageNet mean/std: roughly centred
    assert -2.5 < float(images.mean()) < 2.5 and float(images.std()) > 0.2


@pytest.mark.parametrize("backend", ["dali-cpu", "native"])
def test_val_exactly_once_over_shards(detection_root, backend):
    coco = json.loads((detection_root / "annotations" / "instances_val.json").read_text())
    all_ids = sorted(im["id"] for im in coco["images"])
    seen = []
    for rank in range(2):
        loader = create_detection_loader(detection_root, train=False, backend=backend, batch_size=5, workers=1,
                                         dist=DistInfo(rank=rank, world_size=2, local_rank=0, launcher="test"))
        for _ in range(2):  # two epochs: the second must be the same set again
            ids = [i for *_, image_ids in loader for i in image_ids.tolist()]
            assert len(ids) == len(set(ids))
            seen.append(ids)
    assert sorted(seen[0] + seen[2]) == all_ids and sorted(seen[1] + seen[3]) == all_ids


def test_dali_val_matches_torchvision(detection_root):
    """Same boxes, labels and ids; pixels within the resize filters' difference."""
    dali = create_detection_loader(detection_root, train=False, backend="dali-cpu", batch_size=8, workers=1)
    native = create_detection_loader(detection_root, train=False, backend="native", batch_size=8, workers=0)
    for (di, db, dl, did), (ni, nb, nl, nid) in zip(dali, native):
        assert did.tolist() == nid.tolist()
        m = max(int((dl > 0).sum(1).max()), 1)
        assert torch.equal(dl[:, :m], nl[:, :m])
        torch.testing.assert_close(db[:, :m], nb[:, :m], atol=1e-5, rtol=0)
        diff = (di - ni).abs()
        # DALI's triangular (antialiased linear) downscale vs torchvision's antialiased bilinear
        assert float(diff.mean()) < 0.05, float(diff.mean())


@pytest.mark.parametrize("train", [True, False], ids=["train", "val"])
def test_torch_batches_identical_to_pipeline(detection_root, train):
    """The PyTorch wrapper hands over the pipeline's numbers bit for bit (the TensorFlow test does
    the same there), so both frameworks train on the very same boxes, labels and pixels."""
    import numpy as np

    from crossdali.common.classification import PipelineOptions
    from crossdali.common.detection import TRAIN_OUTPUTS, VAL_OUTPUTS, create_detection_pipeline

    loader = create_detection_loader(detection_root, train=train, batch_size=8, workers=2, seed=11)
    pipe = create_detection_pipeline(loader.source, train=train,
                                     options=PipelineOptions(batch_size=8, num_threads=2, seed=11))
    pipe.build()
    names = TRAIN_OUTPUTS if train else VAL_OUTPUTS
    direct = [np.array(x.as_tensor()) for x in pipe.run()]
    for name, got, want in zip(names, next(iter(loader)), direct):
        np.testing.assert_array_equal(got.numpy(), want.reshape(got.shape), err_msg=name)


def _train_epoch(loader) -> tuple[list, set]:
    """One train epoch (``debug=True``): a key per image, its boxes and labels as read (``raw_boxes``,
    ``raw_labels``) as bytes, which tell the images apart; and the shapes of the batches' outputs."""
    keys, shapes = [], set()
    for images, offsets, labels, raw_boxes, raw_labels, *_ in loader:
        shapes.add((tuple(images.shape), tuple(offsets.shape), tuple(labels.shape)))
        for b, lab in zip(raw_boxes, raw_labels):
            n = int((lab > 0).sum())
            keys.append(b[:n].numpy().tobytes() + lab[:n].numpy().tobytes())
    return keys, shapes


def test_two_pipelines_train_every_image_once(detection_root):
    """pipelines=2: each pipeline reads half of the shard, 4 images a step, merged into batches of 8;
    one epoch reads every train image once (the same images as one pipeline's epoch)."""
    one = create_detection_loader(detection_root, train=True, batch_size=8, workers=2, seed=3, debug=True)
    two = create_detection_loader(detection_root, train=True, batch_size=8, workers=2, seed=3, debug=True,
                                  pipelines=2)
    assert two.pipelines == 2 and len(two) == len(one) == 12
    want, _ = _train_epoch(one)
    got, shapes = _train_epoch(two)
    assert shapes == {((8, 3, 300, 300), (8, 8732, 4), (8, 8732))}
    assert len(got) == one.source.num_images == 96 and len(set(want)) > 90  # the keys tell the images apart
    assert sorted(got) == sorted(want)


def test_two_pipelines_val_every_image_once(detection_root):
    """Val's boxes and labels are padded to each pipeline's longest: merged, they are padded to the
    longest of the batch, and every image keeps its own boxes and labels (as with one pipeline)."""
    coco = json.loads((detection_root / "annotations" / "instances_val.json").read_text())
    by_id = {}
    for pipelines in (1, 2):
        loader = create_detection_loader(detection_root, train=False, batch_size=8, workers=1, pipelines=pipelines)
        seen = {}
        for images, boxes, labels, image_ids in loader:
            assert images.shape == (len(image_ids), 3, 300, 300) and boxes.shape[:2] == labels.shape
            assert int((labels > 0).sum(1).max()) == labels.shape[1]  # padded to the batch's longest, no further
            assert not boxes[labels == 0].any()
            for i, b, lab in zip(image_ids.tolist(), boxes, labels):
                assert i not in seen
                seen[i] = (b[lab > 0], lab[lab > 0])
        assert sorted(seen) == sorted(im["id"] for im in coco["images"])
        by_id[pipelines] = seen
    for i, (b, lab) in by_id[1].items():
        assert torch.equal(by_id[2][i][0], b) and torch.equal(by_id[2][i][1], lab)


def test_pipelines_need_dali(detection_root):
    from crossdali.common.errors import UsageError

    with pytest.raises(UsageError, match="pipelines=2"):
        create_detection_loader(detection_root, train=True, backend="native", batch_size=8, pipelines=2)
