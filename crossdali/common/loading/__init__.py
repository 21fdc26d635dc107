"""The loader machinery every framework shares: the Loader contract and ``prepare_split``, the epoch
rule, the framework-neutral halves of the DALI, external-source and video loaders, and the helpers
around them (fetching ahead, CUDA queues, fork safety)."""
