"""TensorFlow wrappers over crossdali's shared DALI pipelines (``DALIDataset`` + a native tf.data baseline).

Same factory names in ``crossdali.pytorch`` and ``crossdali.mxnet``: switching framework is one
import line. The ``create_*_dataset`` functions return the plain ``tf.data.Dataset`` (for
``model.fit``); iterating a loader keeps ``dali-gpu`` batches on the GPU.
"""

from crossdali.tensorflow.quiet import import_tensorflow

try:
    import_tensorflow()  # without TensorFlow's start-up banners, unless --debug
except ImportError:  # pragma: no cover - depends on the environment
    raise ImportError("crossdali.tensorflow needs TensorFlow and DALI's TF plugin: from the crossdali checkout run "
                      "`pip install -r requirements/tensorflow.txt -e . && pip install --no-build-isolation "
                      "-r requirements/tensorflow-plugin.txt`") from None

from crossdali.tensorflow.dali_loader import DALILoader
from crossdali.tensorflow.detection import DETECTION_BACKENDS, create_detection_dataset, create_detection_loader
from crossdali.tensorflow.devices import enable_memory_growth
from crossdali.tensorflow.loaders import (
    BACKENDS,
    NativeLoader,
    SyntheticLoader,
    create_classification_dataset,
    create_classification_loader,
)
from crossdali.tensorflow.video import VIDEO_BACKENDS, create_video_dataset, create_video_loader

__all__ = ["BACKENDS", "VIDEO_BACKENDS", "DETECTION_BACKENDS", "create_classification_loader", "create_video_loader",
           "create_detection_loader", "create_classification_dataset", "create_video_dataset",
           "create_detection_dataset", "DALILoader", "NativeLoader", "SyntheticLoader", "enable_memory_growth"]
