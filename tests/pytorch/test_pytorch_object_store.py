"""The PyTorch loader factory reads ``s3://`` data (moto's server on the loopback) as the same
batches as the local copy: the augmented train split of TFRecords, the val split of an ImageFolder."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("moto")

from crossdali.pytorch import create_classification_loader  # noqa: E402
from tests.common.s3_server import tiny_set_in_store  # noqa: E402

pytestmark = pytest.mark.pytorch


@pytest.fixture(scope="module")
def s3_tiny_set(tiny_classification):
    with tiny_set_in_store(tiny_classification) as found:
        yield found


@pytest.mark.parametrize("folder,train", [("tfrecord", True), ("imagefolder", False)], ids=["tfrecord-train", "imagefolder-val"])
def test_the_first_batch_is_the_local_one(s3_tiny_set, folder, train):
    _, url, local = s3_tiny_set
    batches = []
    for data in (f"{url}/{folder}", local / folder):
        loader = create_classification_loader(data, train=train, backend="dali-cpu", batch_size=16, crop_size=48,
                                              workers=2, seed=3)
        batches.append(next(iter(loader)))
    (remote_images, remote_labels), (images, labels) = batches
    assert torch.equal(remote_labels, labels) and torch.equal(remote_images, images)
