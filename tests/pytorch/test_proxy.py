"""DALI Proxy with crossdali's transform (``crossdali.pytorch.proxy``): a user's own ``Dataset`` of JPEG
bytes, a real ``DataLoader`` with worker processes, DALI decoding and augmenting in the main process.

On the CPU (``dali-cpu``) here and in CI; the ``gpu`` test runs the same on the GPU machine. The
val batches must equal crossdali's own loader's for the same files bit for bit (one transform
definition); train batches must hold every sample once, at the right size and in the normalised range.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from crossdali.common.classification import IMAGENET_MEAN, IMAGENET_STD  # noqa: E402
from crossdali.common.data.sources import resolve_source  # noqa: E402
from crossdali.common.errors import DataError  # noqa: E402
from crossdali.pytorch import create_classification_loader  # noqa: E402
from crossdali.pytorch.proxy import ProxyDataset, create_proxy_loader, create_proxy_server  # noqa: E402

CROP, BATCH = 64, 8


class JpegFiles(torch.utils.data.Dataset):
    """What a user already has: a Dataset that reads each file's bytes, with its label and index."""

    def __init__(self, files, labels) -> None:
        self.files, self.labels = files, labels

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        return np.fromfile(self.files[i], dtype=np.uint8), self.labels[i], i


@pytest.fixture(scope="module")
def val_source(tiny_classification):
    return resolve_source(tiny_classification / "imagefolder", "val")


@pytest.fixture(scope="module")
def val_reference(val_source):
    """crossdali's own val loader over the same files: (images, labels) in file order."""
    batches = list(create_classification_loader(val_source, train=False, backend="dali-cpu", batch_size=BATCH,
                                                crop_size=CROP, workers=2))
    return torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])


def _epoch(loader):
    images, labels, index = zip(*loader)
    return torch.cat(images), torch.cat(labels), torch.cat(index)


def test_val_batches_equal_crossdali_loader(val_source, val_reference):
    ref_images, ref_labels = val_reference
    with create_proxy_server(train=False, backend="dali-cpu", batch_size=BATCH, crop_size=CROP, workers=2) as server:
        loader = create_proxy_loader(server, JpegFiles(val_source.files, val_source.labels), batch_size=BATCH,
                                     num_workers=2)
        first = next(iter(loader))
        images, labels, index = _epoch(loader)
    assert isinstance(first[0], torch.Tensor) and first[0].shape == (BATCH, 3, CROP, CROP)  # produced, not references
    assert index.tolist() == list(range(val_source.num_samples))  # the DataLoader's order, partial last batch kept
    assert images.dtype == torch.float32 and images.device.type == "cpu"
    assert torch.equal(labels, ref_labels)
    assert torch.equal(images, ref_images), f"max difference {(images - ref_images).abs().max().item()}"


def test_epoch_left_early_gives_the_next_epoch_its_own_images(val_source, val_reference):
    """A ``break`` leaves batches that the workers had already handed to DALI. DALI's own proxy
    ``DataLoader`` hands them to the next epoch under that epoch's labels; ``create_proxy_loader``'s must not."""
    from nvidia.dali.plugin.pytorch.experimental import proxy as dali_proxy

    ref_images, _ = val_reference
    dataset = JpegFiles(val_source.files, val_source.labels)
    with create_proxy_server(train=False, backend="dali-cpu", batch_size=BATCH, crop_size=CROP, workers=2) as server:
        loaders = {"crossdali": create_proxy_loader(server, dataset, batch_size=BATCH, num_workers=2, shuffle=True),
                   "DALI": dali_proxy.DataLoader(server, ProxyDataset(dataset, server), batch_size=BATCH,
                                                 num_workers=2, shuffle=True)}
        wrong = {}
        for name, loader in loaders.items():
            for _ in loader:
                time.sleep(1.0)  # the workers finish the batches they prefetch and hand them to DALI
                break
            images, _, index = _epoch(loader)
            assert sorted(index.tolist()) == list(range(val_source.num_samples))
            wrong[name] = sum(not torch.equal(images[i], ref_images[j]) for i, j in enumerate(index.tolist()))
    assert wrong["crossdali"] == 0, f"{wrong['crossdali']} samples got another sample's image after an early break"
    assert wrong["DALI"] > 0, ("DALI's proxy DataLoader no longer mixes epochs after a break: ProxyLoader's "
                               "generation ids may be unnecessary with this DALI")


def test_train_batches_hold_every_sample_once(tiny_classification):
    source = resolve_source(tiny_classification / "imagefolder", "train")
    lo = min((0 - m) / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD))
    hi = max((255 - m) / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD))
    with create_proxy_server(train=True, backend="dali-cpu", batch_size=16, crop_size=CROP, workers=2) as server:
        loader = create_proxy_loader(server, JpegFiles(source.files, source.labels), batch_size=16, num_workers=2,
                                     shuffle=True, persistent_workers=True)
        epochs = [_epoch(loader) for _ in range(2)]
    for images, labels, index in epochs:
        assert images.shape == (source.num_samples, 3, CROP, CROP) and images.dtype == torch.float32
        assert sorted(index.tolist()) == list(range(source.num_samples))  # every sample once, in the sampler's order
        assert labels.tolist() == [source.labels[i] for i in index.tolist()]
        assert lo - 1e-4 <= images.min().item() < images.max().item() <= hi + 1e-4
    (first, _, i1), (second, _, i2) = epochs
    assert i1.tolist() != i2.tolist(), "the sampler reshuffles every epoch"
    same_sample = torch.argsort(i1), torch.argsort(i2)
    assert not torch.equal(first[same_sample[0]], second[same_sample[1]]), "random crops differ between epochs"


def test_mistakes_are_refused_with_the_fix(val_source):
    with create_proxy_server(train=False, backend="dali-cpu", batch_size=BATCH, crop_size=CROP, workers=1) as server:
        dataset = JpegFiles(val_source.files, val_source.labels)
        for kwargs, words in [(dict(batch_size=BATCH * 2, num_workers=1), "create_proxy_server"),
                              (dict(batch_size=BATCH, num_workers=0), "num_workers >= 1"),
                              (dict(batch_size=BATCH, num_workers=1, collate_fn=list), "default collate"),
                              (dict(batch_size=BATCH, num_workers=1, multiprocessing_context="spawn"), "forked")]:
            with pytest.raises(ValueError, match=words):
                create_proxy_loader(server, dataset, **kwargs)
        pixels = [(np.zeros((8, 8, 3), np.uint8), 0)] * BATCH  # decoded images: not for DALI
        with pytest.raises(DataError, match="encoded file's bytes"):
            next(iter(create_proxy_loader(server, pixels, batch_size=BATCH, num_workers=1)))
        gif = [(b"GIF89a" + bytes(10), 0)] * BATCH
        with pytest.raises(DataError, match="GIF"):
            next(iter(create_proxy_loader(server, gif, batch_size=BATCH, num_workers=1)))
    with pytest.raises(ValueError, match="dali-gpu, dali-cpu"):
        create_proxy_server(train=False, backend="native")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (DALI mixed decoder)")
def test_gpu_val_batches_equal_crossdali_loader(val_source):
    """On the GPU: the images arrive on cuda:0 and equal crossdali's dali-gpu loader's bit for bit."""
    ref = torch.cat([x for x, _ in create_classification_loader(val_source, train=False, backend="dali-gpu",
                                                                batch_size=BATCH, crop_size=CROP, workers=2)])
    with create_proxy_server(train=False, backend="dali-gpu", batch_size=BATCH, crop_size=CROP, workers=2) as server:
        images, labels, index = _epoch(create_proxy_loader(server, JpegFiles(val_source.files, val_source.labels),
                                                           batch_size=BATCH, num_workers=2))
    assert images.is_cuda and index.tolist() == list(range(val_source.num_samples))
    assert torch.equal(images, ref), f"max difference {(images - ref).abs().max().item()}"
