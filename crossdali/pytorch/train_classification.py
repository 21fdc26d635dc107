"""Train an image classifier (ResNet-50 by default) on DALI-fed batches.

    python -m crossdali.pytorch.train_classification                      # sample data, auto backend
    torchrun --nproc_per_node 8 -m crossdali.pytorch.train_classification --data /imagenet
    horovodrun -np 8 python -m crossdali.pytorch.train_classification --data /imagenet

Shaped like torchvision's references/classification/train.py; the pieces shared with the SSD and
video scripts live in ``crossdali.pytorch.training``. Without ``--data`` it builds the embedded
sample set (if missing) and trains on it. Outputs go to ``--output-dir`` (default
``runs/classification-pytorch-<arch>-<time>``): ``metrics.jsonl``, ``checkpoint_last.pth``,
``checkpoint_best.pth`` and ``curves.png``. SIGTERM/SIGINT saves a checkpoint after the current
step; ``--resume`` continues it mid-epoch with the very batches an uninterrupted run would see.
``--multi-label`` trains on a multi-label list (``train.txt``/``val.txt``: an image path and its
labels per line; without ``--data`` the multi-label sample set) with sigmoid + binary
cross-entropy, and reports mAP and macro F1.
"""

from __future__ import annotations

import argparse
import logging

import torch

from crossdali.common.data.sample_data import class_names as sample_class_names
from crossdali.common.data.sample_data import ensure_classification, ensure_multilabel
from crossdali.common.data.sources import resolve_source
from crossdali.common.errors import UsageError
from crossdali.common.multilabel import resolve_multilabel_splits
from crossdali.common.scripts import script_parsers
from crossdali.common.scripts.defaults import resolve_defaults
from crossdali.common.scripts.metrics import format_test_line
from crossdali.common.scripts.script import run
from crossdali.common.scripts.train_args import resolve_auto_augment, resolve_num_classes
from crossdali.pytorch.distributed import Runtime
from crossdali.pytorch.loaders import create_classification_loader
from crossdali.pytorch.models import create_model
from crossdali.pytorch.multilabel import create_multilabel_loader
from crossdali.pytorch.training import (
    MixedPrecision,
    StepTracker,
    StopRequest,
    build_on_rank0,
    choose_backend,
    evaluate_classifier,
    evaluate_multilabel,
    graph_model,
    load_checkpoint,
    resolve_cuda_graphs,
    seed_everything,
    start_run,
    training_session,
)

log = logging.getLogger("crossdali.train")


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    """This script's flags, defined framework-free (``crossdali.common.scripts.script_parsers``) so that
    ``crossdali train classification --framework pytorch --help`` answers before PyTorch loads."""
    return script_parsers.pytorch_classification(add_help=add_help)


def train_one_epoch(model, criterion, optimizer, scheduler, loader, *, amp: MixedPrecision, tracker: StepTracker,
                    runtime: Runtime, channels_last: bool) -> dict[str, float]:
    model.train()
    device = runtime.device
    for images, target in tracker.steps(loader):
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        if channels_last:  # the loaders hand out NCHW batches (see load_data): one layout copy on the GPU
            images = images.contiguous(memory_format=torch.channels_last)
        with amp.autocast():
            loss = criterion(model(images), target)
        amp.backward_step(loss, optimizer)
        scheduler.step()
        tracker.step_done(loss, images.shape[0])
    return tracker.epoch_stats()


def evaluate(model, criterion, loader, *, runtime: Runtime, amp: MixedPrecision, num_classes: int,
             channels_last: bool, multi_label: bool = False) -> dict[str, float]:
    """Loss and top-1/top-5 (multi-label: mAP and macro F1) over the whole val set: every sample
    once across all ranks."""
    if multi_label:
        return evaluate_multilabel(model, criterion, loader, runtime=runtime, amp=amp, channels_last=channels_last)
    return evaluate_classifier(model, criterion, loader, runtime=runtime, amp=amp, num_classes=num_classes,
                               channels_last=channels_last)


def load_multilabel_data(args, runtime: Runtime, backend: str):
    """``load_data`` for ``--multi-label``: list files through the external-source loader."""
    data = args.data
    if data is None:
        data = build_on_rank0(runtime, lambda: ensure_multilabel(size=args.sample_size))
    train_src, val_src = resolve_multilabel_splits(args, data, backend)
    common = dict(backend=backend, batch_size=args.batch_size, crop_size=args.crop_size, workers=args.workers,
                  py_workers=max(1, args.workers // 2), seed=args.seed, dist=runtime.dist,
                  device_id=runtime.gpu_id)  # NCHW batches: see load_data
    train_loader = create_multilabel_loader(train_src, train=True, checkpointing=True, **common)
    val_loader = create_multilabel_loader(val_src, train=False, **common)
    return train_loader, val_loader, train_src.num_classes, list(train_src.classes)


def load_data(args, runtime: Runtime, backend: str):
    """Train and val loaders over the same dataset, sharded by the global rank, and the class names."""
    if args.pipelines != 1 and args.multi_label:  # a backend without DALI pipelines: the loader says so
        raise UsageError(f"--pipelines {args.pipelines}: the --multi-label loader runs one DALI pipeline per "
                         "process; leave --pipelines out")
    auto_augment = resolve_auto_augment(args, backend=backend)  # refused here where nothing would run it
    if args.global_order and args.multi_label:
        raise UsageError("--global-order orders the single-label loader; the --multi-label loader reads in DALI's "
                         "sharded order: leave --global-order out")
    if args.multi_label:
        return load_multilabel_data(args, runtime, backend)
    data = args.data
    if data is None:
        sample_set = lambda: ensure_classification(size=args.sample_size, formats=("imagefolder",))  # noqa: E731
        data = build_on_rank0(runtime, sample_set) / "imagefolder"
    common = dict(backend=backend, batch_size=args.batch_size, crop_size=args.crop_size, workers=args.workers,
                  seed=args.seed, dist=runtime.dist, device_id=runtime.gpu_id,
                  dtype="float32", hw_decoder_load=args.hw_decoder_load)
    if getattr(args, "prefetch_queue_depth", None) is not None:  # from crossdali tune (resolve_defaults)
        common["prefetch_queue_depth"] = args.prefetch_queue_depth
    # NCHW batches, copied to channels-last on the GPU each step under --channels-last, not the loaders'
    # channels_last view of DALI's NHWC output: the view trained ResNet-50 no faster, and somewhat slower
    # in side-by-side runs (docs/benchmarks.md#training-speed)
    check = dict(format=args.data_format, exclude=args.exclude, validate=not args.skip_check)
    train_src = resolve_source(data, "train", **check)
    val_src = resolve_source(data, "val", **check)
    # checkpointing: the train loader's state_dict carries DALI's position for a mid-epoch resume
    train_loader = create_classification_loader(train_src, train=True, auto_augment=auto_augment, checkpointing=True,
                                                pipelines=args.pipelines, global_order=args.global_order, **common)
    val_loader = create_classification_loader(val_src, train=False, pipelines=args.pipelines, **common)
    num_classes = resolve_num_classes(args.num_classes, train_src.num_classes, data_format=train_src.format, data=data)
    if train_src.classes:
        names = list(train_src.classes)
    elif args.data is None:
        names = sample_class_names()
    else:
        names = [str(i) for i in range(num_classes)]
    return train_loader, val_loader, num_classes, names


def main(args: argparse.Namespace) -> dict[str, float]:
    with training_session(engine=args.engine, debug=args.debug) as (runtime, stop):
        return _train(args, runtime, stop)


def _train(args: argparse.Namespace, runtime: Runtime, stop: StopRequest) -> dict[str, float]:
    seed_everything(args.seed)
    ckpt = load_checkpoint(args.resume) if args.resume is not None else None  # a bad file fails before any data
    cuda_graphs = resolve_cuda_graphs(runtime, args.cuda_graphs) and not args.test_only  # graphs train only
    backend = choose_backend(args.data_backend)
    log.info("rank %d/%d (launcher %s, engine %s), device %s", runtime.dist.rank, runtime.dist.world_size,
             runtime.dist.launcher, runtime.engine, runtime.device)
    defaults = resolve_defaults(args, cuda=runtime.device.type == "cuda", world_size=runtime.dist.world_size)
    train_loader, val_loader, num_classes, class_names = load_data(args, runtime, backend)

    args.num_classes = num_classes  # the checkpoint's config then holds what `crossdali predict` needs
    model = create_model(args.arch, num_classes=num_classes).to(runtime.device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if args.multi_label:
        criterion = torch.nn.BCEWithLogitsLoss()  # one sigmoid per class: any number of labels per image
    else:
        criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    metric = "val_map" if args.multi_label else "val_top1"
    r = start_run(args, runtime, model, train_loader, task="classification", metric=metric, ckpt=ckpt, backend=backend,
                  num_classes=num_classes, class_names=class_names, reference_batch=256,
                  meta={"multi_label": args.multi_label},
                  start={"pipelines": args.pipelines, "cuda_graphs": cuda_graphs,
                         **defaults.record()})

    if args.test_only:
        stats = evaluate(r.ddp_model, criterion, val_loader, runtime=runtime, amp=r.amp, num_classes=num_classes,
                         channels_last=args.channels_last, multi_label=args.multi_label)
        log.info(format_test_line(stats))
        r.metrics.write(event="test", **stats)
        return stats

    if cuda_graphs:
        graph_model(r.model, batch_shape=(args.batch_size, 3, args.crop_size, args.crop_size), runtime=runtime,
                    amp=r.amp, channels_last=args.channels_last)
    tracker = r.tracker(stop)
    stats: dict[str, float] = {}
    while r.state.epoch < args.epochs:
        stats = train_one_epoch(r.ddp_model, criterion, r.optimizer, r.scheduler, train_loader, amp=r.amp, tracker=tracker,
                                runtime=runtime, channels_last=args.channels_last)
        stats |= evaluate(r.ddp_model, criterion, val_loader, runtime=runtime, amp=r.amp, num_classes=num_classes,
                          channels_last=args.channels_last, multi_label=args.multi_label)
        tracker.end_epoch(stats)
    r.finish()
    return stats


if __name__ == "__main__":
    run(main, get_args_parser())
