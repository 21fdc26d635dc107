"""Evaluation over the val split, each sample seen once across all ranks: loss and top-k for
classifiers, loss, mAP and F1 for multi-label models."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

import torch

from crossdali.common.scripts.metrics import topk_for
from crossdali.pytorch.distributed import Runtime, gather_objects
from crossdali.pytorch.training.amp import MixedPrecision

__all__ = ["topk_correct", "accuracy_counts", "val_outputs", "evaluate_classifier", "evaluate_multilabel"]


def topk_correct(output: torch.Tensor, target: torch.Tensor, topk: tuple[int, ...] = (1, 5)) -> torch.Tensor:
    """Number of samples whose target is among the top-k predictions, for each k, on ``output``'s device."""
    maxk = min(max(topk), output.shape[1])
    pred = output.topk(maxk, dim=1).indices
    correct = pred.eq(target.view(-1, 1))
    return torch.stack([correct[:, : min(k, maxk)].any(dim=1).sum() for k in topk])



def accuracy_counts(output: torch.Tensor, target: torch.Tensor, topk: tuple[int, ...] = (1, 5)) -> list[int]:
    """Number of samples whose target is among the top-k predictions, for each k."""
    return topk_correct(output, target, topk).tolist()



def val_outputs(model: torch.nn.Module, loader: Iterable, *, runtime: Runtime, amp: MixedPrecision,
                channels_last: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(float32 model output, target)`` of every val batch on the device (call in inference mode)."""
    model.eval()
    for inputs, target in loader:
        inputs, target = inputs.to(runtime.device, non_blocking=True), target.to(runtime.device, non_blocking=True)
        if channels_last:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        with amp.autocast():
            output = model(inputs)
        yield output.float(), target



@torch.inference_mode()
def evaluate_classifier(model: torch.nn.Module, criterion: torch.nn.Module, loader: Iterable, *, runtime: Runtime,
                        amp: MixedPrecision, num_classes: int, channels_last: bool = False) -> dict[str, float]:
    """Loss and top-k (k < classes) over every val sample, each seen once across all ranks."""
    ks = topk_for(num_classes)
    # the loss sum and the top-k counts stay on the device until the last batch: a read per batch would
    # make the host wait for each batch's model before fetching the next one (StepTracker's docstring)
    totals = torch.zeros(1 + len(ks), dtype=torch.float64, device=runtime.device)
    seen = 0
    start = time.perf_counter()
    for output, target in val_outputs(model, loader, runtime=runtime, amp=amp, channels_last=channels_last):
        totals[0] += criterion(output, target).double() * output.shape[0]
        totals[1:] += topk_correct(output, target, ks)
        seen += output.shape[0]
    loss_sum, *correct = totals.tolist()
    loss_sum, seen, *correct = runtime.all_reduce_sum([loss_sum, seen, *correct])
    stats = {"val_loss": loss_sum / max(seen, 1), "val_samples": int(seen), "eval_seconds": time.perf_counter() - start}
    return stats | {f"val_top{k}": 100 * c / max(seen, 1) for k, c in zip(ks, correct)}



@torch.inference_mode()
def evaluate_multilabel(model: torch.nn.Module, criterion: torch.nn.Module, loader: Iterable, *, runtime: Runtime,
                        amp: MixedPrecision, channels_last: bool = False) -> dict[str, float]:
    """Binary cross-entropy, mAP and macro F1 (sigmoid >= 0.5) over every val sample, each seen
    once across all ranks: the scores are gathered, since average precision ranks them all."""
    from crossdali.common.multilabel import multilabel_metrics

    # scores, targets and the loss sum stay on the device until the last batch (as in evaluate_classifier)
    loss_total = torch.zeros((), dtype=torch.float64, device=runtime.device)
    scores, targets = [], []
    start = time.perf_counter()
    for output, target in val_outputs(model, loader, runtime=runtime, amp=amp, channels_last=channels_last):
        loss_total += criterion(output, target).double() * output.shape[0]
        scores.append(torch.sigmoid(output))
        targets.append(target)
    mine = (torch.cat(scores).cpu().numpy(), torch.cat(targets).cpu().numpy()) if scores else None
    parts = [p for p in gather_objects(runtime, mine) if p is not None]
    (loss_sum,) = runtime.all_reduce_sum([loss_total.item()])
    seen = sum(len(p[0]) for p in parts)  # the gathered parts are every rank's already
    stats = {"val_loss": loss_sum / max(seen, 1), "val_samples": int(seen), "eval_seconds": time.perf_counter() - start}
    if not parts:
        return stats
    import numpy as np

    found = multilabel_metrics(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    return stats | {"val_map": found["map"], "val_f1": found["f1"]}
