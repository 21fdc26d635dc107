"""PyTorch wrappers over crossdali's shared DALI pipelines.

Same factory names in ``crossdali.tensorflow``, ``crossdali.jax`` and ``crossdali.mxnet``: switching
framework is one import line.
"""

try:
    import torch  # noqa: F401
except ImportError:  # pragma: no cover - depends on the environment
    raise ImportError("crossdali.pytorch needs PyTorch: from the crossdali checkout run "
                      "`pip install -r requirements/pytorch.txt -e .`") from None

from crossdali.pytorch.detection import DETECTION_BACKENDS, create_detection_loader
from crossdali.pytorch.external import create_external_source_loader
from crossdali.pytorch.loaders import BACKENDS, create_classification_loader
from crossdali.pytorch.video import VIDEO_BACKENDS, create_video_loader

__all__ = ["BACKENDS", "VIDEO_BACKENDS", "DETECTION_BACKENDS", "create_classification_loader", "create_video_loader",
           "create_detection_loader", "create_external_source_loader"]
# create_multilabel_loader: ``from crossdali.pytorch.multilabel import create_multilabel_loader`` (it
# imports scikit-learn, which the other loaders do not need)
