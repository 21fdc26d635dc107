"""The TensorFlow column of the model table names real tf.keras.applications builders."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")

from crossdali.common.models import builder_name, models_for  # noqa: E402
from crossdali.tensorflow.train_classification import create_model  # noqa: E402


def test_every_tensorflow_name_is_a_keras_application():
    missing = [n for n in models_for("tensorflow")
               if n != "small_cnn" and not callable(getattr(tf.keras.applications, builder_name(n, "tensorflow"), None))]
    assert missing == []


def test_shared_and_keras_spellings_build_the_same_model():
    a = create_model("mobilenet_v2", num_classes=3, crop_size=32)
    b = create_model("mobilenetv2", num_classes=3, crop_size=32)
    assert a.name == b.name == "mobilenet_v2" and a.count_params() == b.count_params()
    with pytest.raises(ValueError, match="'resnet18' is not available in tensorflow, only in pytorch, jax, mxnet"):
        create_model("resnet18", num_classes=3, crop_size=32)
