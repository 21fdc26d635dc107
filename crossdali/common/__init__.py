"""Framework-free DALI pipelines and helpers. Never imports torch, tensorflow or mxnet."""
