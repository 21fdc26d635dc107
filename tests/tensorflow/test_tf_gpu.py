"""dali-gpu through DALIDataset: batches (images AND labels) stay on the GPU, pixels close to the CPU
pipeline (not bit-exact: the mixed decoder is nvJPEG / the hardware decoder, see docs/parity.md),
and TensorFlow leaves DALI's decoders their GPU memory. Needs a GPU visible to a GPU build of
TensorFlow (tensorflow[and-cuda]); skipped elsewhere. On the GPU machine:

    python -m pytest tests/tensorflow/test_tf_gpu.py tests/detection/test_tf_detection.py \
        tests/video/test_tensorflow_video.py -m gpu -rA
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("nvidia.dali.plugin.tf")

from crossdali.common.classification import IMAGENET_STD  # noqa: E402
from crossdali.tensorflow import create_classification_loader  # noqa: E402

pytestmark = [pytest.mark.tensorflow, pytest.mark.gpu,
              pytest.mark.skipif(not tf.config.list_physical_devices("GPU"),
                                 reason="no GPU visible to TensorFlow (tensorflow-cpu, or no CUDA GPU)")]
ROOT = Path(__file__).resolve().parents[2]


def _devices(batch) -> list[str]:
    return [x.device for x in batch]


@pytest.mark.parametrize("hw_decoder_load", [0.0, 1.0], ids=["cuda-decoder", "hw-decoder"])
def test_dali_gpu_val_close_to_cpu(tiny_classification, hw_decoder_load):
    kw = dict(train=False, batch_size=55, crop_size=64, workers=2)
    (xg, yg), = list(create_classification_loader(tiny_classification / "imagefolder", backend="dali-gpu",
                                                  hw_decoder_load=hw_decoder_load, device_id=0, **kw))
    (xc, yc), = list(create_classification_loader(tiny_classification / "imagefolder", backend="dali-cpu", **kw))
    assert "GPU" in xg.device and "GPU" in yg.device, _devices((xg, yg))
    assert xg.dtype == tf.float32 and tuple(xg.shape) == (55, 64, 64, 3)
    np.testing.assert_array_equal(yg.numpy(), yc.numpy())
    diff = np.abs(xg.numpy() - xc.numpy()) * np.array(IMAGENET_STD)
    # decoders differ by a few grey levels at most on average; the geometry is identical
    assert diff.mean() < 3.0, f"mean diff {diff.mean():.3f} grey levels"


def test_dali_gpu_train_epochs_stay_on_the_gpu(tiny_classification):
    """Every batch of two epochs on the GPU, the short last one (trimmed) included."""
    loader = create_classification_loader(tiny_classification / "imagefolder", train=True, backend="dali-gpu",
                                          batch_size=32, crop_size=64, workers=2, device_id=0)
    for _ in range(2):
        batches = list(loader)
        assert len(batches) == 9 and sum(int(lab.shape[0]) for _, lab in batches) == 264
        for images, labels in batches:
            assert "GPU" in images.device and "GPU" in labels.device, _devices((images, labels))
            assert labels.dtype == tf.int64 and tuple(labels.shape) == (images.shape[0],)
    assert loader.epoch == 2


def test_dlpack_handover_shares_the_gpu_batches(tiny_classification):
    """``handover="dlpack"``: DALI's GPU buffers handed to TensorFlow without DALIDataset; two train epochs
    equal to the ``dataset`` hand-over's to the bit (the same pipeline and seed), on the GPU, compared after
    all of them were handed out (more than the loader keeps alive: the tensors hold their own buffers)."""
    kw = dict(train=True, backend="dali-gpu", batch_size=32, crop_size=64, workers=2, device_id=0, seed=5)
    epochs = {}
    for handover in ("dataset", "dlpack"):
        loader = create_classification_loader(tiny_classification / "imagefolder", handover=handover,
                                              hold_batches=2, **kw)
        epochs[handover] = [list(loader) for _ in range(2)]
    for got, want in zip(sum(epochs["dlpack"], []), sum(epochs["dataset"], [])):
        assert "GPU" in got[0].device and "GPU" in got[1].device, _devices(got)
        np.testing.assert_array_equal(got[1].numpy(), want[1].numpy())
        np.testing.assert_array_equal(got[0].numpy(), want[0].numpy())


def test_train_dataset_stays_on_the_gpu(indexed_val_source):
    """``loader.dataset`` for train on a GPU is the DALIDataset itself: batches on the GPU, full,
    every sample once per pass of the reader."""
    loader = create_classification_loader(indexed_val_source, train=True, backend="dali-gpu", batch_size=8,
                                          crop_size=32, workers=2, device_id=0)
    assert loader.dataset is loader.stream_dataset
    with tf.device("/GPU:0"):
        it = iter(loader.dataset)
    seen = []
    for _ in range(7):
        images, labels = next(it)
        assert "GPU" in images.device, images.device
        assert tuple(images.shape) == (8, 32, 32, 3) and tuple(labels.shape) == (8,)
        seen += labels.numpy().tolist()
    assert sorted(seen[:55]) == list(range(55))


def test_loader_iteration_and_dataset_agree_on_the_gpu(indexed_val_source):
    """The same bits from the GPU-side bookkeeping (loader iteration) and tf.data's (``.dataset``,
    val: the exact epoch view), over two shards (the val reader pads and rotates shards)."""
    from crossdali.common.distributed import DistInfo

    loader = create_classification_loader(indexed_val_source, train=False, backend="dali-gpu", batch_size=8,
                                          crop_size=32, workers=2, device_id=0, dist=DistInfo(1, 2, 1, "test"))
    from_loader, from_dataset = list(loader), list(loader.dataset)
    assert len(from_loader) == len(from_dataset) == 4
    for (xa, ya), (xb, yb) in zip(from_loader, from_dataset):
        np.testing.assert_array_equal(ya.numpy(), yb.numpy())
        np.testing.assert_array_equal(xa.numpy(), xb.numpy())
    assert sorted(i for _, y in from_loader for i in y.numpy().tolist()) == list(range(27, 55))


def _run(code: str, data: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0", "DATA": str(data)}  # conftest put ROOT on PYTHONPATH
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_loader_turns_on_memory_growth_and_the_hw_decoder_gets_memory(tiny_classification):
    """In a fresh process (TensorFlow has not touched the GPU): creating the dali-gpu loader turns on
    memory growth, and an epoch with the hardware decoder runs without nvJPEG allocation errors
    (measured before: 'nvjpeg error #5' with TF holding all GPU memory)."""
    proc = _run("""
import json, os, tensorflow as tf
from crossdali.tensorflow import create_classification_loader
loader = create_classification_loader(os.environ["DATA"], train=False, backend="dali-gpu", batch_size=16,
                                      crop_size=64, hw_decoder_load=1.0, device_id=0)
big = tf.zeros([256, 1024, 1024], tf.float32)  # 1 GiB for the model: TF still takes only what it needs
n = sum(int(y.shape[0]) for _, y in loader)
print(json.dumps({"growth": [tf.config.experimental.get_memory_growth(g) for g in tf.config.get_visible_devices("GPU")],
                  "samples": n, "device": big.device}))
""", tiny_classification / "imagefolder")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["growth"] and all(result["growth"]) and result["samples"] == 55, result
    assert "nvjpeg error" not in proc.stderr.lower(), proc.stderr[-3000:]


def test_too_late_for_memory_growth_is_a_warning(tiny_classification):
    proc = _run("""
import os, tensorflow as tf
with tf.device("/GPU:0"):
    tf.zeros([1]) + 1  # TF initialises its GPUs here, without memory growth
from crossdali.tensorflow import create_classification_loader
create_classification_loader(os.environ["DATA"], train=False, backend="dali-gpu", batch_size=16, crop_size=64,
                             device_id=0)
""", tiny_classification / "imagefolder")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "already initialised" in proc.stderr and "enable_memory_growth" in proc.stderr, proc.stderr[-3000:]


def test_external_source_loader_on_the_gpu(indexed_val_source, assert_epoch_coverage):
    """The TensorFlow external-source loader with dali-gpu (the packed input copied to the GPU):
    batches on the GPU, every sample once over two shards, the same bits as the GPU file reader
    over the same files (same decoder, same transform)."""
    from crossdali.common.distributed import DistInfo
    from crossdali.tensorflow.external import create_external_source_loader

    items = [(Path(f).read_bytes(), label) for f, label in zip(indexed_val_source.files, indexed_val_source.labels)]
    kw = dict(train=False, backend="dali-gpu", batch_size=8, crop_size=32, workers=2, device_id=0)
    seen = []
    for rank in range(2):
        batches = list(create_external_source_loader(items, num_classes=55, dist=DistInfo(rank=rank, world_size=2),
                                                     **kw))
        assert all("GPU" in x.device and "GPU" in y.device for x, y in batches), _devices(batches[0])
        seen.append([int(i) for _, y in batches for i in y.numpy()])
    assert_epoch_coverage(seen, 55)
    ours = list(create_external_source_loader(items, num_classes=55, **kw))
    reference = list(create_classification_loader(indexed_val_source, **kw))
    for (a, la), (b, lb) in zip(ours, reference, strict=True):
        np.testing.assert_array_equal(la.numpy(), lb.numpy())
        np.testing.assert_array_equal(a.numpy(), b.numpy())
