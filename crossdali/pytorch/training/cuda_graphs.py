"""``--cuda-graphs``: the model's training forward and backward captured as CUDA graphs, and when
that is possible."""

from __future__ import annotations

import logging
import time
import warnings

import torch

from crossdali.common.errors import UsageError
from crossdali.pytorch.distributed import Runtime
from crossdali.pytorch.training.amp import MixedPrecision

__all__ = ["resolve_cuda_graphs", "graph_model"]

log = logging.getLogger(__name__)


def resolve_cuda_graphs(runtime: Runtime, choice: str = "auto") -> bool:
    """``--cuda-graphs auto|on|off``: whether ``graph_model`` captures the model. ``auto``: where one
    process trains on a CUDA GPU, where graphs bring ResNet-50 fed by ``dali-gpu`` closer to its
    synthetic-data speed (docs/benchmarks.md#training-speed). ``on`` where that cannot be is refused in
    one line, before any data is read or any run folder made."""
    if choice == "off":
        return False
    why = None
    if runtime.device.type != "cuda":
        why = f"the model runs on the {runtime.device.type} here, and CUDA graphs are CUDA's"
    elif runtime.engine != "none":
        why = (f"one process only (this job runs {runtime.dist.world_size} under {runtime.engine}, whose gradient "
               "hooks a graph cannot hold)")
    if why is not None and choice == "on":
        raise UsageError(f"--cuda-graphs on: {why}; leave --cuda-graphs out")
    return why is None



def graph_model(model: torch.nn.Module, *, batch_shape: tuple[int, ...], runtime: Runtime, amp: MixedPrecision,
                channels_last: bool = False) -> torch.nn.Module:
    """``--cuda-graphs``: the model's training forward and backward captured as two CUDA graphs
    (``torch.cuda.make_graphed_callables``), so that a step costs the host two graph launches, the loss
    and the fused optimizer's few kernels instead of the hundreds of kernels of ResNet-50, and a host
    stall (the loader, Python) shorter than the host's lead no longer leaves the GPU idle. In place;
    returns ``model``.

    Batches of ``batch_shape`` replay the graphs (copied into the graph's static input first); any other
    shape (an epoch's short last batch) and eval mode run the ordinary forward. The graphs keep their
    own memory for a full batch's activations, so that short batch needs its own beside them. The
    capture's warm-up runs the model on a random batch: the BatchNorm statistics it moves are put back,
    so a graphed run trains from the same state as an eager one. Call it before the first step; the
    parameters must not be replaced afterwards (a checkpoint loads into them in place). A model that
    cannot be captured (it reads a value back to the host, or changes shape) is a UsageError naming
    ``--cuda-graphs off``: a failed capture leaves CUDA's random generator unusable in this process
    (the next ``torch.randn`` fails), so the run cannot go on without graphs instead.
    """
    t0 = time.perf_counter()
    eager_forward = model.forward
    buffers = [b.detach().clone() for b in model.buffers()]
    sample = torch.randn(batch_shape, device=runtime.device)
    if channels_last:
        sample = sample.contiguous(memory_format=torch.channels_last)
    was_training = model.training
    model.train()
    try:
        with amp.autocast(cache=False), warnings.catch_warnings():
            # make_graphed_callables's own doing, printed at every capture (torch 2.11): its warm-up backward
            # starts on autograd's thread, and the parameters' gradient nodes get its capture stream.
            # Filtering them changes no kernel.
            warnings.filterwarnings("ignore", message="Attempting to run cuBLAS, but there was no current CUDA context")
            warnings.filterwarnings("ignore", message="The AccumulateGrad node's stream does not match")
            torch.cuda.make_graphed_callables(model, (sample,))
    except Exception as e:
        why = (str(e).strip().splitlines() or [""])[0]
        raise UsageError(f"--cuda-graphs: {type(model).__name__} cannot be captured as a CUDA graph "
                         f"({type(e).__name__}: {why}); rerun with --cuda-graphs off") from e
    model.train(was_training)
    with torch.no_grad():
        for saved, b in zip(buffers, model.buffers()):
            b.copy_(saved)
    graphed_forward = model.forward  # make_graphed_callables's: the graphs in the mode they were captured in

    def forward(images: torch.Tensor) -> torch.Tensor:
        return graphed_forward(images) if images.shape == sample.shape else eager_forward(images)

    model.forward = forward
    log.info("CUDA graphs: the training forward and backward captured for batches of %s in %.1f s",
             "x".join(map(str, batch_shape)), time.perf_counter() - t0)
    return model
