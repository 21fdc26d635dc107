"""Framework-free DALI pipelines and helpers. Never imports torch, tensorflow or mxnet."""

from crossdali.common.loading import fork_safety

fork_safety.install()  # before any DALI or DataLoader worker is forked from this process
