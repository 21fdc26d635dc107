"""crossdali's DALI plugin in the MXNet environment (numpy 1.23, its own DALI install): the library is
built (or found in the cache) here and loads, and the SSD train pipeline with
``DetectionTransform(fused_colour=True)`` gives the default pipeline's batches bit for bit, handed to
MXNet as NDArrays. crossdali's MXNet package has classification loaders only (no SSD example), so the
pipeline is run directly; tests/common/test_custom_operator.py tests the operator itself."""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mxnet")


def test_mxnet_fused_ssd_train_batches_equal_the_default_pipeline(data_root):
    from crossdali.common.data.sample_data.detection import ensure_detection
    from crossdali.common.detection import (
        TRAIN_OUTPUTS,
        DetectionTransform,
        create_detection_pipeline,
        resolve_detection_source,
    )
    from crossdali.common.options import PipelineOptions
    from crossdali.common.plugins import build_plugin, load_plugin

    load_plugin(build_plugin())
    source = resolve_detection_source(ensure_detection(data_root, "tiny"), "train")
    batches = {}
    for fused in (False, True):
        pipe = create_detection_pipeline(source, train=True, options=PipelineOptions(batch_size=8, num_threads=2, seed=5),
                                         transform=DetectionTransform(fused_colour=fused))
        pipe.build()
        batches[fused] = [mx.nd.array(np.array(out.as_tensor()), dtype=np.array(out.as_tensor()).dtype)
                          for out in pipe.run()]
    for name, want, got in zip(TRAIN_OUTPUTS, batches[False], batches[True]):
        assert got.shape == want.shape and got.dtype == want.dtype, name
        assert (got == want).min().asscalar() == 1, name
