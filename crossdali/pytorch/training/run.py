"""One training run of a PyTorch script once its model is built: optimizer, schedule, mixed
precision, run folder, checkpointer, metrics, set up the same way by every script (``start_run``)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from crossdali.common.loading.cuda_queues import VARIABLE as CUDA_QUEUES_VARIABLE
from crossdali.common.scripts.metrics import MetricsWriter
from crossdali.common.scripts.runs import choose_run_dir, finish_run, open_metrics, plain_config
from crossdali.pytorch.distributed import Runtime
from crossdali.pytorch.training.amp import MixedPrecision
from crossdali.pytorch.training.checkpoint import Checkpointer, TrainState
from crossdali.pytorch.training.optim import create_optimizer, create_scheduler, scaled_lr
from crossdali.pytorch.training.session import agree_run_dir
from crossdali.pytorch.training.steps import StepTracker, StopRequest

__all__ = ["Run", "start_run"]

log = logging.getLogger(__name__)


@dataclass
class Run:
    """What a PyTorch training script trains with once its model is built, set up the same way by
    the classification, SSD and video scripts (``start_run``)."""

    args: Any
    runtime: Runtime
    model: torch.nn.Module  #: the bare model: what checkpoints hold
    ddp_model: torch.nn.Module  #: what the steps run (DDP-wrapped under torchrun)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    amp: MixedPrecision
    run_dir: Path
    checkpointer: Checkpointer
    state: TrainState
    metrics: MetricsWriter
    metric: str
    lr: float

    def tracker(self, stop: StopRequest, *, unit: str = "img") -> StepTracker:
        """The per-step bookkeeping of this run's epochs (``--checkpoint-every``, ``--print-freq``)."""
        return StepTracker(self.state, runtime=self.runtime, checkpointer=self.checkpointer, metrics=self.metrics,
                           stop=stop, epochs=self.args.epochs, checkpoint_every=self.args.checkpoint_every,
                           print_freq=self.args.print_freq, unit=unit)

    def finish(self, *, unit: str = "img") -> None:
        """The summary record, the plot and the summary lines (rank 0), then the metrics file closed."""
        if self.runtime.dist.is_main:
            finish_run(self.run_dir, metrics=self.metrics, metric=self.metric, unit=unit)
        self.metrics.close()



def start_run(args: Any, runtime: Runtime, model: torch.nn.Module, train_loader: Any, *, task: str, metric: str,
              ckpt: dict | None, backend: str, num_classes: int, class_names: list[str],
              reference_batch: int | None, warmup_start_factor: float = 0.1, meta: dict | None = None,
              start: dict | None = None) -> Run:
    """Optimizer and schedule (``--opt``, ``--lr`` scaled to the global batch from
    ``reference_batch``, warm-up from ``warmup_start_factor``), AMP, the run folder and its
    checkpointer (``metric`` picks ``checkpoint_best``), the model wrapped for the engine, the
    ``--resume`` state restored, and ``metrics.jsonl`` opened with its ``start`` record. ``meta``:
    more of the checkpoint's metadata; ``start``: more fields of the start record."""
    lr = scaled_lr(args.lr, batch_size=args.batch_size, world_size=runtime.dist.world_size,
                   reference_batch=reference_batch)
    optimizer = create_optimizer(args.opt, model.parameters(), lr=lr, momentum=args.momentum,
                                 weight_decay=args.weight_decay)
    scheduler = create_scheduler(optimizer, epochs=args.epochs, steps_per_epoch=len(train_loader),
                                 warmup_epochs=args.lr_warmup_epochs, start_factor=warmup_start_factor)
    amp = MixedPrecision(enabled=args.amp, runtime=runtime)
    run_dir = choose_run_dir(args.output_dir, resume=args.resume, task=task, framework="pytorch", arch=args.arch)
    run_dir = agree_run_dir(runtime, run_dir)
    checkpointer = Checkpointer(run_dir, runtime=runtime, metric=metric, meta={
        "task": task, "framework": "pytorch", "arch": args.arch, "num_classes": num_classes, **(meta or {}),
        "class_names": class_names, "config": plain_config(args)})
    ddp_model = runtime.wrap_model(model)
    optimizer = runtime.wrap_optimizer(optimizer, model)
    state = TrainState(model=model, optimizer=optimizer, scheduler=scheduler, amp=amp, loader=train_loader)
    checkpointer.resume(ckpt, state, path=args.resume, test_only=args.test_only)
    metrics = open_metrics(run_dir, continuing=ckpt is not None, enabled=runtime.dist.is_main)
    log.info("outputs: %s", run_dir)
    metrics.write(event="start", task=task, framework="pytorch", arch=args.arch, backend=backend,
                  world_size=runtime.dist.world_size, engine=runtime.engine, batch_size=args.batch_size, lr=lr,
                  epochs=args.epochs, num_classes=num_classes, resumed_from=str(args.resume) if ckpt else None,
                  epoch=state.epoch, step=state.step, torch_threads=torch.get_num_threads(),
                  cuda_queues=os.environ.get(CUDA_QUEUES_VARIABLE) if runtime.device.type == "cuda" else None,
                  fused_optimizer=bool(optimizer.param_groups[0].get("fused")), **(start or {}))
    return Run(args=args, runtime=runtime, model=model, ddp_model=ddp_model, optimizer=optimizer, scheduler=scheduler,
               amp=amp, run_dir=run_dir, checkpointer=checkpointer, state=state, metrics=metrics, metric=metric, lr=lr)
