"""The PyTorch loader factory reads ``s3://`` data (moto's server on the loopback) as the same
first batch of the augmented train split as the local copy (every layout's val split:
tests/common/test_object_store.py); the native backend refuses it with the fix."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("moto")

from crossdali.pytorch import create_classification_loader  # noqa: E402

pytestmark = pytest.mark.pytorch


def test_the_first_batch_is_the_local_one(s3_tiny_set):
    _, url, local = s3_tiny_set
    batches = []
    for data in (f"{url}/tfrecord", local / "tfrecord"):
        loader = create_classification_loader(data, train=True, backend="dali-cpu", batch_size=16, crop_size=48,
                                              workers=2, seed=3)
        batches.append(next(iter(loader)))
    (remote_images, remote_labels), (images, labels) = batches
    assert torch.equal(remote_labels, labels) and torch.equal(remote_images, images)


def test_the_native_backend_says_to_use_dali(s3_tiny_set):
    from crossdali.common.errors import UsageError

    _, url, _ = s3_tiny_set
    with pytest.raises(UsageError, match="dali-gpu or dali-cpu"):
        create_classification_loader(f"{url}/imagefolder", train=False, backend="native", batch_size=16, crop_size=48)
