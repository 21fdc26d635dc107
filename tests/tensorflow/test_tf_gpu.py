"""dali-gpu through DALIDataset: batches on the GPU, close to the CPU pipeline (not bit-exact: the
mixed decoder is nvJPEG / the hardware decoder, see docs/parity.md). Needs a GPU visible to a
GPU build of TensorFlow (tensorflow[and-cuda]); skipped elsewhere."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("nvidia.dali.plugin.tf")

from crossdali.common.classification import IMAGENET_STD  # noqa: E402
from crossdali.tensorflow import create_classification_loader  # noqa: E402

pytestmark = [pytest.mark.tensorflow, pytest.mark.gpu,
              pytest.mark.skipif(not tf.config.list_physical_devices("GPU"),
                                 reason="no GPU visible to TensorFlow (tensorflow-cpu, or no CUDA GPU)")]


@pytest.mark.parametrize("hw_decoder_load", [0.0, 1.0], ids=["cuda-decoder", "hw-decoder"])
def test_dali_gpu_val_close_to_cpu(tiny_classification, hw_decoder_load):
    kw = dict(train=False, batch_size=55, crop_size=64, workers=2)
    (xg, yg), = list(create_classification_loader(tiny_classification / "imagefolder", backend="dali-gpu",
                                                  hw_decoder_load=hw_decoder_load, device_id=0, **kw))
    (xc, yc), = list(create_classification_loader(tiny_classification / "imagefolder", backend="dali-cpu", **kw))
    assert "GPU" in xg.device and xg.dtype == tf.float32 and tuple(xg.shape) == (55, 64, 64, 3)
    np.testing.assert_array_equal(yg.numpy(), yc.numpy())
    diff = np.abs(xg.numpy() - xc.numpy()) * np.array(IMAGENET_STD)
    # decoders differ by a few grey levels at most on average; the geometry is identical
    assert diff.mean() < 3.0, f"mean diff {diff.mean():.3f} grey levels"


def test_dali_gpu_train_epoch(tiny_classification):
    loader = create_classification_loader(tiny_classification / "imagefolder", train=True, backend="dali-gpu",
                                          batch_size=32, crop_size=64, workers=2, device_id=0)
    labels = [lab for _, lab in loader]
    assert len(labels) == len(loader) == 9 and sum(int(lab.shape[0]) for lab in labels) == 264
