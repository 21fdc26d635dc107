"""The PyTorch column of the model table: every torchvision classifier by its own name, and
``small_cnn``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

from crossdali.common.models import models_for  # noqa: E402
from crossdali.pytorch.models import SmallCNN, create_model  # noqa: E402


def test_the_table_lists_exactly_torchvisions_classifiers():
    """A torchvision release that adds or drops a model shows here, not as a refused --arch."""
    assert set(models_for("pytorch")) - {"small_cnn"} == set(torchvision.models.list_models(module=torchvision.models))


def test_create_model_by_name_and_alias():
    torch.manual_seed(0)
    model = create_model("small_cnn", num_classes=7)
    assert isinstance(model, SmallCNN) and model(torch.zeros(2, 3, 32, 32)).shape == (2, 7)
    assert type(create_model("mobilenetv2", num_classes=3)).__name__ == "MobileNetV2"  # TensorFlow's spelling
    with pytest.raises(ValueError, match="'resnet50_v2' is not available in pytorch, only in tensorflow, mxnet"):
        create_model("resnet50_v2", num_classes=3)


def test_the_video_names_are_the_video_models():
    from crossdali.common.models import VIDEO_MODELS
    from crossdali.video.models import ARCHS

    assert tuple(VIDEO_MODELS) == tuple(ARCHS)
