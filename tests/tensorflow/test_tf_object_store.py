"""The TensorFlow loader factory reads ``s3://`` data (moto's server on the loopback) as the same
first batch as the local copy, in a process started with the system libcrypto preloaded (what
docs/object-stores.md#tensorflow tells users); without it, one clear error instead of an abort."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("nvidia.dali.plugin.tf")
pytest.importorskip("moto")

from crossdali.common.data.sources import resolve_source  # noqa: E402
from crossdali.common.errors import DataError  # noqa: E402

pytestmark = pytest.mark.tensorflow

FIRST_BATCHES = """
import sys
import numpy as np
from crossdali.tensorflow import create_classification_loader
batches = []
for data in sys.argv[1:]:
    loader = create_classification_loader(data, train=True, backend="dali-cpu", batch_size=16, crop_size=48, workers=2,
                                          seed=3)
    images, labels = next(iter(loader))
    batches.append((images.numpy(), labels.numpy()))
(a, la), (b, lb) = batches
np.testing.assert_array_equal(la, lb)
np.testing.assert_array_equal(a, b)
print("same first batch")
"""


def test_the_first_batch_is_the_local_one(s3_tiny_set):
    _, url, local = s3_tiny_set
    env = {**os.environ, "LD_PRELOAD": ctypes.util.find_library("crypto") or "libcrypto.so.3"}
    proc = subprocess.run([sys.executable, "-c", FIRST_BATCHES, f"{url}/tfrecord", str(local / "tfrecord")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "same first batch" in proc.stdout, proc.stderr[-3000:]


def test_without_the_preload_one_clear_error(s3_tiny_set, monkeypatch):
    _, url, _ = s3_tiny_set
    monkeypatch.delenv("LD_PRELOAD", raising=False)  # TensorFlow is imported in this process
    with pytest.raises(DataError, match="LD_PRELOAD=.*libcrypto"):
        resolve_source(f"{url}/tfrecord", "train")
