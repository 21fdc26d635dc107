"""The MXNet loader factory reads ``s3://`` data (moto's server on the loopback) as the same first
batch as the local copy."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mxnet")
pytest.importorskip("moto")

from crossdali.mxnet import create_classification_loader  # noqa: E402

pytestmark = pytest.mark.mxnet


def test_the_first_batch_is_the_local_one(s3_tiny_set):
    _, url, local = s3_tiny_set
    batches = []
    for data in (f"{url}/tfrecord", local / "tfrecord"):
        it = create_classification_loader(data, train=True, backend="dali-cpu", batch_size=16, crop_size=48, workers=2,
                                          seed=3)
        batch = next(iter(it))
        batches.append((batch.data[0].asnumpy(), batch.label[0].asnumpy()))
    (remote_images, remote_labels), (images, labels) = batches
    np.testing.assert_array_equal(remote_labels, labels)
    np.testing.assert_array_equal(remote_images, images)
