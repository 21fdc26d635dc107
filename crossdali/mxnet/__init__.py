"""MXNet wrappers over crossdali's shared DALI pipelines (DALI >= 1.40 has no MXNet plugin).

Same factory names as ``crossdali.pytorch`` and ``crossdali.tensorflow``: switching framework is
one import line.
"""

try:
    import mxnet  # noqa: F401
except ImportError:  # pragma: no cover - depends on the environment
    raise ImportError("crossdali.mxnet needs mxnet: in an environment of its own (mxnet 1.9.1 needs numpy 1.23.5), "
                      "from the crossdali checkout run `pip install -r requirements/mxnet.txt -e .`") from None

from crossdali.mxnet.external import ExternalSourceOptions, create_external_source_loader, create_multilabel_loader
from crossdali.mxnet.loaders import BACKENDS, DALIClassificationIter, create_classification_loader

__all__ = ["BACKENDS", "DALIClassificationIter", "ExternalSourceOptions", "create_classification_loader",
           "create_external_source_loader", "create_multilabel_loader"]
