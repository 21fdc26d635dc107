"""crossdali's DALI plugin in the TensorFlow environment: the library is built (or found in the cache)
against this environment's DALI wheel, and the SSD train batches of ``DetectionTransform(fused_colour=True)``
through the TensorFlow loader (DALIDataset) are bit for bit the default pipeline's
(tests/common/test_custom_operator.py tests the operator itself)."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("nvidia.dali.plugin.tf")


def test_tf_fused_ssd_train_batches_equal_the_default_pipeline(data_root):
    from crossdali.common.data.sample_data.detection import ensure_detection
    from crossdali.common.detection import TRAIN_OUTPUTS, DetectionTransform
    from crossdali.common.plugins import build_plugin, load_plugin
    from crossdali.tensorflow.detection import create_detection_loader

    load_plugin(build_plugin())
    root = ensure_detection(data_root, "tiny")
    batches = {}
    for fused in (False, True):
        loader = create_detection_loader(root, train=True, batch_size=8, workers=2, seed=5,
                                         transform=DetectionTransform(fused_colour=fused))
        batches[fused] = next(iter(loader))
    for name, want, got in zip(TRAIN_OUTPUTS, batches[False], batches[True]):
        assert isinstance(got, tf.Tensor)
        np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=name)
