"""crossdali's DALI plugin in the JAX environment: the library is built (or found in the cache) against
this environment's DALI wheel, and the SSD train batches of ``DetectionTransform(fused_colour=True)``
through the JAX loader are bit for bit the default pipeline's (tests/common/test_custom_operator.py
tests the operator itself)."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("nvidia.dali.plugin.jax")

pytestmark = pytest.mark.jax


def test_jax_fused_ssd_train_batches_equal_the_default_pipeline(data_root):
    from crossdali.common.data.sample_data.detection import ensure_detection
    from crossdali.common.detection import TRAIN_OUTPUTS, DetectionTransform
    from crossdali.common.plugins import build_plugin, load_plugin
    from crossdali.jax import create_detection_loader

    load_plugin(build_plugin())
    root = ensure_detection(data_root, "tiny")
    batches = {}
    for fused in (False, True):
        loader = create_detection_loader(root, train=True, batch_size=8, workers=2, seed=5,
                                         transform=DetectionTransform(fused_colour=fused))
        batches[fused] = [tuple(np.asarray(x) for x in b) for b, _ in zip(loader, range(2))]
    for default, fused in zip(batches[False], batches[True]):
        for name, want, got in zip(TRAIN_OUTPUTS, default, fused):
            np.testing.assert_array_equal(got, want, err_msg=name)
