"""The JAX parity dump is exactly what the shared pipeline produces, brought to NCHW."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("nvidia.dali.plugin.jax")

from crossdali.common.classification import ClassificationTransform, PipelineOptions, create_classification_pipeline  # noqa: E402
from crossdali.common.data.sources import resolve_source  # noqa: E402
from crossdali.parity import DumpConfig, dump, load_dump  # noqa: E402

pytestmark = [pytest.mark.jax, pytest.mark.parity]


def test_dump_equals_the_raw_pipeline_transposed(tiny_classification, tmp_path):
    cfg = DumpConfig(data=str(tiny_classification / "imagefolder"), batches=2, batch_size=8, crop_size=32)
    meta, batches = load_dump(dump("jax", tmp_path, cfg))
    assert meta["layout"] == "NCHW" and meta["framework"] == "jax" and "jax" in meta["versions"]
    for split in ("train", "val"):
        src = resolve_source(cfg.data, split)
        pipe = create_classification_pipeline(
            src, train=split == "train", transform=ClassificationTransform(crop_size=32, output_layout="CHW"),
            options=PipelineOptions(batch_size=8, num_threads=cfg.workers, seed=cfg.seed))
        pipe.build()
        assert len(batches[split]) == 2
        for images, labels in batches[split]:
            raw_images, raw_labels = pipe.run()
            assert images.shape == (8, 3, 32, 32) and images.dtype == np.float32 and labels.dtype == np.int64
            np.testing.assert_array_equal(images, np.asarray(raw_images.as_tensor()))  # bit for bit
            np.testing.assert_array_equal(labels, np.asarray(raw_labels.as_tensor()).reshape(-1))
