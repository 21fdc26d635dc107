"""The pieces every PyTorch training script shares (classification, SSD, video), so a fix lands
once: backend choice, seeding, optimiser and warm-up + cosine schedule, mixed precision with a
``GradScaler``, accuracy, the per-step bookkeeping (data wait, metrics record, progress bar,
checkpoints every N steps, a graceful stop on SIGTERM/SIGINT) and checkpoints that resume
mid-epoch with exactly the batches, augmentation and losses of an uninterrupted run.

The scripts keep torchvision's shape (``get_args_parser``, ``train_one_epoch``, ``evaluate``,
``load_data``, ``main``); each ``train_one_epoch`` is::

    for images, target in tracker.steps(loader):
        with amp.autocast():
            loss = criterion(model(images), target)
        amp.backward_step(loss, optimizer)
        scheduler.step()
        tracker.step_done(loss, images.shape[0])
    return tracker.epoch_stats()

Scripts import everything from this package; each job has its own module: ``session`` (process
group, logging, backend, seed), ``optim`` (optimizer and schedule), ``amp`` (mixed precision),
``cuda_graphs``, ``evaluation``, ``checkpoint`` (run state, save and resume), ``steps`` (per-step
bookkeeping and the graceful stop) and ``run`` (``start_run``: all of them assembled).
"""

from crossdali.pytorch.distributed import gather_objects
from crossdali.pytorch.loaders import SyntheticBatches  # the scripts' synthetic loader, in __all__ here too
from crossdali.pytorch.training.amp import MixedPrecision
from crossdali.pytorch.training.checkpoint import CHECKPOINT_BEST, CHECKPOINT_LAST, Checkpointer, TrainState, load_checkpoint
from crossdali.pytorch.training.cuda_graphs import graph_model, resolve_cuda_graphs
from crossdali.pytorch.training.evaluation import accuracy_counts, evaluate_classifier, evaluate_multilabel, topk_correct
from crossdali.pytorch.training.optim import create_optimizer, create_scheduler, scaled_lr
from crossdali.pytorch.training.run import Run, start_run
from crossdali.pytorch.training.session import (
    ENGINES,
    agree_run_dir,
    build_on_rank0,
    choose_backend,
    seed_everything,
    training_session,
)
from crossdali.pytorch.training.steps import StepTracker, StopRequest, copy_to_host

__all__ = ["ENGINES", "CHECKPOINT_LAST", "CHECKPOINT_BEST", "training_session", "choose_backend", "seed_everything",
           "agree_run_dir", "build_on_rank0", "scaled_lr", "create_optimizer", "create_scheduler", "MixedPrecision",
           "accuracy_counts", "topk_correct", "evaluate_classifier", "evaluate_multilabel", "SyntheticBatches",
           "gather_objects", "StopRequest", "TrainState", "Checkpointer", "copy_to_host",
           "load_checkpoint", "StepTracker", "Run", "start_run", "resolve_cuda_graphs", "graph_model"]
