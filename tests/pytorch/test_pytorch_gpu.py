"""GPU paths of the classification pipeline (mixed decoder, hardware JPEG decoder).

Skipped where no CUDA GPU is visible; run on the GPU machine by ``bash benchmarks/run_on_gpu.sh tests``,
whose log is committed as results/latest/gpu_tests.log.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from crossdali.common.classification import IMAGENET_STD  # noqa: E402
from crossdali.common.distributed import DistInfo  # noqa: E402
from crossdali.pytorch import create_classification_loader  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (DALI mixed decoder)"),
]


@pytest.mark.parametrize("train", [True, False], ids=["train", "val"])
@pytest.mark.parametrize("hw_decoder_load", [0.0, 1.0])
def test_dali_gpu_batches_on_cuda(tiny_classification, train, hw_decoder_load):
    loader = create_classification_loader(tiny_classification / "imagefolder", train=train, backend="dali-gpu",
                                          batch_size=16, crop_size=64, hw_decoder_load=hw_decoder_load)
    batches = list(loader)
    assert sum(len(lab) for _, lab in batches) == (264 if train else 55)
    for images, labels in batches:
        assert images.is_cuda and labels.is_cuda and images.shape[1:] == (3, 64, 64)
        assert images.dtype == torch.float32 and labels.dtype == torch.int64


@pytest.mark.parametrize("hw_decoder_load", [0.0, 1.0])
def test_gpu_val_close_to_cpu_val(tiny_classification, hw_decoder_load):
    """Same DALI ops, different JPEG decoders (nvJPEG CUDA / hardware vs libjpeg-turbo): not
    bit-exact, but within a few grey levels on average."""
    data = tiny_classification / "imagefolder"
    gpu = torch.cat([x.cpu() for x, _ in create_classification_loader(
        data, train=False, backend="dali-gpu", batch_size=16, crop_size=224, hw_decoder_load=hw_decoder_load)])
    cpu = torch.cat([x for x, _ in create_classification_loader(data, train=False, backend="dali-cpu",
                                                                batch_size=16, crop_size=224)])
    grey = ((gpu - cpu) * torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)).abs()
    print(f"hw_decoder_load={hw_decoder_load}: mean {grey.mean():.3f}, max {grey.max():.1f} grey levels")
    assert grey.mean() < 2.0


def test_gpu_channels_last_same_values_float16_close(tiny_classification):
    """DALI's GPU kernels writing NHWC (the ``channels_last`` view) give the very values of NCHW. In
    float16 they are close to float32's but not float32's rounded once (an equality check failed with
    values one and two float16 steps apart), so the training script keeps float32 batches."""
    kw = dict(train=False, backend="dali-gpu", batch_size=16, crop_size=64)
    data = tiny_classification / "imagefolder"
    plain = [x for x, _ in create_classification_loader(data, **kw)]
    last = [x for x, _ in create_classification_loader(data, channels_last=True, **kw)]
    half = [x for x, _ in create_classification_loader(data, dtype="float16", channels_last=True, **kw)]
    worst = 0.0
    for a, b, c in zip(plain, last, half, strict=True):
        assert b.is_cuda and b.is_contiguous(memory_format=torch.channels_last) and torch.equal(b, a)
        assert c.dtype == torch.float16 and c.is_contiguous(memory_format=torch.channels_last)
        worst = max(worst, float((c.float() - a.half().float()).abs().max()))
        assert torch.allclose(c.float(), a, rtol=2e-3, atol=1e-3)
    print(f"float16 against float32 rounded to float16: largest difference {worst:.5f}")


def test_gpu_val_exactly_once_over_two_shards(indexed_val_source, assert_epoch_coverage):
    seen = []
    for rank in range(2):
        loader = create_classification_loader(indexed_val_source, train=False, backend="dali-gpu", batch_size=8,
                                              crop_size=32, dist=DistInfo(rank, 2, 0, "test"), device_id=0)
        seen.append([i for _, lab in loader for i in lab.tolist()])
    assert_epoch_coverage(seen, indexed_val_source.num_samples)


def test_gpu_train_reproducible_with_seed(tiny_classification):
    def first_batch(seed):
        loader = create_classification_loader(tiny_classification / "imagefolder", train=True, backend="dali-gpu",
                                              batch_size=16, crop_size=64, seed=seed)
        images, labels = next(iter(loader))
        return images.cpu(), labels.cpu()

    (a, la), (b, lb), (c, _) = first_batch(5), first_batch(5), first_batch(6)
    assert torch.equal(la, lb) and torch.equal(a, b)
    assert not torch.equal(a, c)
