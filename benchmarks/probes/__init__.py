"""One-question probes of DALI's behaviour that the code or docs cite as the reason for a choice
(``python -m benchmarks.probes.<name>``). They are not user benchmarks: ``crossdali bench`` does not list them."""
