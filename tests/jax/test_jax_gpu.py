"""GPU paths of the JAX wrapper: batches on the JAX GPU device, bit-identical to DALI's PyTorch
iterator over the same pipeline and seed (mixed decoder, hardware JPEG decoder on and off).

Skipped where JAX sees no GPU; run on the GPU machine (JAX with CUDA, and PyTorch for the
comparison: ``python -m pytest tests/jax -m gpu``).
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("nvidia.dali.plugin.jax")

from crossdali.common.distributed import DistInfo  # noqa: E402
from crossdali.jax import create_classification_loader, create_detection_loader, create_video_loader  # noqa: E402
from crossdali.jax.loaders import _gpu_devices  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.jax,
    pytest.mark.skipif(not _gpu_devices(), reason="needs a CUDA GPU visible to JAX (DALI mixed decoder)"),
]


def _on_gpu(x) -> bool:
    return {d.platform for d in x.devices()} == {"gpu"}


@pytest.mark.parametrize("train", [True, False], ids=["train", "val"])
@pytest.mark.parametrize("hw_decoder_load", [0.0, 1.0])
def test_dali_gpu_batches_on_the_gpu(tiny_classification, train, hw_decoder_load):
    loader = create_classification_loader(tiny_classification / "imagefolder", train=train, backend="dali-gpu",
                                          batch_size=16, crop_size=64, hw_decoder_load=hw_decoder_load)
    batches = list(loader)
    assert sum(len(lab) for _, lab in batches) == (264 if train else 55)
    for images, labels in batches:
        assert _on_gpu(images) and _on_gpu(labels) and images.shape[1:] == (64, 64, 3)
        assert images.dtype == jax.numpy.float32


@pytest.mark.parametrize("train", [True, False], ids=["train", "val"])
@pytest.mark.parametrize("hw_decoder_load", [0.0, 1.0])
def test_bit_identical_to_pytorch_dali_gpu(tiny_classification, train, hw_decoder_load):
    """The same pipeline, seed and decoder through DALI's JAX and PyTorch iterators: the same bits."""
    torch = pytest.importorskip("torch")
    from crossdali.pytorch import create_classification_loader as create_torch_loader

    kwargs = dict(train=train, backend="dali-gpu", batch_size=16, crop_size=64, seed=3, workers=2,
                  hw_decoder_load=hw_decoder_load)
    data = tiny_classification / "imagefolder"
    ours = [(np.asarray(x), np.asarray(y)) for x, y in create_classification_loader(data, layout="CHW", **kwargs)]
    theirs = [(x.cpu().numpy(), y.cpu().numpy()) for x, y in create_torch_loader(data, **kwargs)]
    assert len(ours) == len(theirs) == (17 if train else 4)
    for (xa, ya), (xb, yb) in zip(ours, theirs):
        np.testing.assert_array_equal(ya, yb)
        assert xa.shape == xb.shape and (xa.view(np.uint8) == xb.view(np.uint8)).all()  # bit for bit
    assert torch.cuda.is_available()


def test_gpu_val_exactly_once_over_two_shards(indexed_val_source, assert_epoch_coverage):
    seen = []
    for rank in range(2):
        loader = create_classification_loader(indexed_val_source, train=False, backend="dali-gpu", batch_size=8,
                                              crop_size=32, dist=DistInfo(rank, 2, 0, "test"), device_id=0)
        seen.append([int(i) for _, lab in loader for i in lab.tolist()])
    assert_epoch_coverage(seen, indexed_val_source.num_samples)


def test_gpu_detection_and_video_on_the_gpu(detection_root, gpu_video):
    images, offsets, labels = next(iter(create_detection_loader(detection_root, train=True, backend="dali-gpu",
                                                                batch_size=8, workers=2)))
    assert all(map(_on_gpu, (images, offsets, labels))) and offsets.shape == (8, 8732, 4)
    clips, clip_labels = next(iter(create_video_loader(gpu_video, train=True, backend="dali-gpu", batch_size=4,
                                                       sequence_length=8, crop_size=64, workers=2)))
    assert _on_gpu(clips) and _on_gpu(clip_labels) and clips.shape == (4, 8, 64, 64, 3)


def test_gpu_training_step_runs_on_dali_gpu_batches(data_root, tiny_classification, monkeypatch, tmp_path):
    from crossdali.jax.train_classification import get_args_parser, main

    monkeypatch.setenv("CROSSDALI_DATA", str(data_root))
    stats = main(get_args_parser().parse_args(
        ["--sample-size", "tiny", "--arch", "small_cnn", "--crop-size", "64", "-b", "24", "--lr", "0.8",
         "--lr-warmup-epochs", "1", "-j", "4", "--print-freq", "0", "--epochs", "6", "--data-backend", "dali-gpu",
         "--output-dir", str(tmp_path)]))
    print(stats)
    assert stats["val_samples"] == 55 and stats["train_samples"] == 264 and stats["val_top1"] >= 40.0, stats


def test_external_source_loader_on_the_gpu_bit_identical_to_pytorch(indexed_val_source, assert_epoch_coverage):
    """``crossdali.jax.create_external_source_loader`` with ``dali-gpu``: jax.Arrays on the GPU, every
    sample once over two shards with spawned DALI workers, the same bits as PyTorch's loader."""
    torch = pytest.importorskip("torch")
    from pathlib import Path

    from crossdali.jax.external import ExternalSourceOptions, create_external_source_loader
    from crossdali.pytorch.external import create_external_source_loader as create_torch_loader

    items = [(Path(f).read_bytes(), label) for f, label in zip(indexed_val_source.files, indexed_val_source.labels)]
    kwargs = dict(backend="dali-gpu", batch_size=8, crop_size=32, num_classes=55, workers=2, seed=5)
    seen = []
    for rank in range(2):
        loader = create_external_source_loader(items, train=False, dist=DistInfo(rank=rank, world_size=2),
                                               feed=ExternalSourceOptions(parallel=True, py_workers=2), **kwargs)
        batches = list(loader)
        assert all(_on_gpu(x) and _on_gpu(y) and x.shape[1:] == (32, 32, 3) for x, y in batches)
        seen.append([int(i) for _, y in batches for i in np.asarray(y)])
    assert_epoch_coverage(seen, 55)
    ours = [(np.asarray(x), np.asarray(y)) for x, y in create_external_source_loader(items, train=True, layout="CHW",
                                                                                      **kwargs)]
    theirs = [(x.cpu().numpy(), y.cpu().numpy()) for x, y in create_torch_loader(items, train=True, **kwargs)]
    assert len(ours) == len(theirs) == 7
    for (xa, ya), (xb, yb) in zip(ours, theirs):
        np.testing.assert_array_equal(ya, yb)
        assert (xa.view(np.uint8) == xb.view(np.uint8)).all()  # bit for bit
    assert torch.cuda.is_available()
