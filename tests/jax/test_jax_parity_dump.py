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


def test_gpu_dumps_read_one_pipeline_where_the_default_is_several():
    """On ``dali-gpu`` the JAX and PyTorch SSD and video training loaders default to several pipelines, each
    reading its own part of the shard into a batch; TensorFlow's ``DALIDataset`` has one. The dumps pin one, or
    the GPU comparison finds other samples in TensorFlow's batches rather than other preprocessing."""
    from crossdali.common.detection import default_detection_pipelines
    from crossdali.jax import create_detection_loader, create_video_loader
    from crossdali.parity import _detection_kwargs, _video_kwargs

    cfg = DumpConfig(data="unused", backend="dali-gpu")
    assert default_detection_pipelines("dali-gpu", cfg.batch_size, train=True) > 1  # what the dump overrides
    assert _detection_kwargs(cfg, create_detection_loader)["pipelines"] == 1
    assert _video_kwargs(cfg, create_video_loader)["pipelines"] == 1
