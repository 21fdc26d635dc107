"""JAX wrappers over crossdali's shared DALI pipelines (DALI's JAX iterator: ``jax.Array`` batches).

Same factory names as ``crossdali.pytorch``, ``crossdali.tensorflow`` and ``crossdali.mxnet``:
switching framework is one import line. See docs/jax.md.
"""

try:
    import jax  # noqa: F401
except ImportError:  # pragma: no cover - depends on the environment
    raise ImportError("crossdali.jax needs JAX (and flax + optax for its training example); from this checkout: "
                      "pip install -r requirements/jax.txt -e .") from None

from crossdali.jax.detection import DETECTION_BACKENDS, create_detection_loader
from crossdali.jax.external import create_external_source_loader
from crossdali.jax.loaders import BACKENDS, create_classification_loader
from crossdali.jax.video import VIDEO_BACKENDS, create_video_loader

__all__ = ["BACKENDS", "VIDEO_BACKENDS", "DETECTION_BACKENDS", "create_classification_loader", "create_video_loader",
           "create_detection_loader", "create_external_source_loader"]
# create_multilabel_loader: ``from crossdali.jax.multilabel import create_multilabel_loader`` (it
# imports scikit-learn, which the other loaders do not need)
