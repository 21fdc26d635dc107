"""crossdali: one NVIDIA DALI data pipeline, every framework.

``crossdali.common`` defines the pipelines once (framework-free); ``crossdali.pytorch``,
``crossdali.tensorflow`` and ``crossdali.mxnet`` wrap them with the same factory names.
"""

__version__ = "0.1.0"
