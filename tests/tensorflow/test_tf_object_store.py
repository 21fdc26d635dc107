"""The TensorFlow loader factory reads ``s3://`` data (moto's server on the loopback) as the same
first batch as the local copy."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("nvidia.dali.plugin.tf")
pytest.importorskip("moto")

from crossdali.tensorflow import create_classification_loader  # noqa: E402
from tests.common.s3_server import tiny_set_in_store  # noqa: E402

pytestmark = pytest.mark.tensorflow


@pytest.fixture(scope="module")
def s3_tiny_set(tiny_classification):
    with tiny_set_in_store(tiny_classification) as found:
        yield found


def test_the_first_batch_is_the_local_one(s3_tiny_set):
    _, url, local = s3_tiny_set
    batches = []
    for data in (f"{url}/tfrecord", local / "tfrecord"):
        loader = create_classification_loader(data, train=True, backend="dali-cpu", batch_size=16, crop_size=48,
                                              workers=2, seed=3)
        images, labels = next(iter(loader))
        batches.append((images.numpy(), labels.numpy()))
    (remote_images, remote_labels), (images, labels) = batches
    np.testing.assert_array_equal(remote_labels, labels)
    np.testing.assert_array_equal(remote_images, images)
