"""Train a video classifier on DALI-decoded clips (PyTorch).

    python -m crossdali.video.train                          # embedded sample clips, small 3D CNN
    python -m crossdali.video.train --arch r2plus1d_18 --data /kinetics --clip-len 16 --crop-size 112
    torchrun --nproc_per_node 8 -m crossdali.video.train --data /kinetics

Shaped like torchvision's references/video_classification/train.py; the pieces shared with the
classification and SSD scripts live in ``crossdali.pytorch.training`` (same flags, mixed precision
with loss scaling, checkpoints, mid-epoch resume, run folder ``runs/video-pytorch-<arch>-<time>``
by default). Without ``--data`` it builds the embedded sample set (a photo patch moving up / down /
growing / shrinking over a texture: chance is 25 %, and one frame cannot tell the classes apart)
and trains on it. ``--data-backend auto`` picks ``dali-gpu`` (NVDEC) when a GPU is visible,
``dali-cpu`` otherwise.
"""

from __future__ import annotations

import argparse
import logging

import torch

from crossdali.common.data.sample_data.video import ensure_video
from crossdali.common.data.videos import resolve_video_source
from crossdali.common.loading.epochs import batch_sizes, choose_last_batch_policy
from crossdali.common.scripts import script_parsers
from crossdali.common.scripts.script import run
from crossdali.common.video import default_video_batch_size
from crossdali.pytorch.distributed import Runtime
from crossdali.pytorch.training import (
    MixedPrecision,
    StepTracker,
    StopRequest,
    SyntheticBatches,
    build_on_rank0,
    choose_backend,
    evaluate_classifier,
    load_checkpoint,
    seed_everything,
    start_run,
    training_session,
)
from crossdali.pytorch.video import create_video_loader
from crossdali.video.models import create_video_model

log = logging.getLogger("crossdali.video.train")


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    """This script's flags, defined framework-free (``crossdali.common.scripts.script_parsers``) so that
    ``crossdali train video --help`` answers before PyTorch loads."""
    return script_parsers.video_classification(add_help=add_help)


def train_one_epoch(model, criterion, optimizer, scheduler, loader, *, amp: MixedPrecision, tracker: StepTracker,
                    runtime: Runtime) -> dict[str, float]:
    model.train()
    device = runtime.device
    for clips, target in tracker.steps(loader):
        clips, target = clips.to(device, non_blocking=True), target.to(device, non_blocking=True)
        with amp.autocast():
            loss = criterion(model(clips), target)
        amp.backward_step(loss, optimizer)  # float16 on CUDA: scaled, so small gradients do not underflow
        scheduler.step()
        tracker.step_done(loss, clips.shape[0])
    return tracker.epoch_stats()


def evaluate(model, criterion, loader, *, runtime: Runtime, amp: MixedPrecision, num_classes: int) -> dict[str, float]:
    """Loss and top-1 (top-5 with more than 5 classes) over every val clip, each once across all ranks."""
    return evaluate_classifier(model, criterion, loader, runtime=runtime, amp=amp, num_classes=num_classes)


def _synthetic_loader(num_clips: int, num_classes: int, args, runtime: Runtime, *, train: bool) -> SyntheticBatches:
    g = torch.Generator().manual_seed(args.seed)
    n, size = args.batch_size, args.crop_size
    batch = (torch.randn((n, 3, args.clip_len, size, size), generator=g),
             torch.randint(0, num_classes, (n,), generator=g))
    policy = choose_last_batch_policy(train=train, num_shards=runtime.dist.world_size)
    sizes = batch_sizes(num_clips, batch_size=n, shard_id=runtime.dist.rank, num_shards=runtime.dist.world_size,
                        policy=policy)  # the real loader's, short last one too
    return SyntheticBatches(tuple(t.to(runtime.device) for t in batch), sizes=sizes,
                            num_classes=num_classes)


def load_data(args, runtime: Runtime, backend: str):
    """Train and val clip loaders over the same dataset, sharded by the global rank, and the class names."""
    data = args.data
    if data is None:
        data = build_on_rank0(runtime, lambda: ensure_video(size=args.sample_size))
    if args.skip_check:  # the clip count of an epoch comes from probing every file, so it cannot be skipped
        log.info("--skip-check: video files are probed anyway (their frame counts size the epoch)")
    train_src = resolve_video_source(data, "train", exclude=args.exclude)
    val_src = resolve_video_source(data, "val", exclude=args.exclude)
    num_classes = max(train_src.num_classes, val_src.num_classes)
    names = list(train_src.classes) if len(train_src.classes) == num_classes else [str(i) for i in range(num_classes)]
    if backend == "synthetic":  # one random batch; as many batches as one clip per file would give
        return (_synthetic_loader(train_src.num_samples, num_classes, args, runtime, train=True),
                _synthetic_loader(val_src.num_samples, num_classes, args, runtime, train=False), num_classes, names)
    common = {"backend": backend, "batch_size": args.batch_size, "sequence_length": args.clip_len,
              "stride": args.frame_stride, "step": args.clip_step, "crop_size": args.crop_size,
              "workers": args.workers, "seed": args.seed, "dist": runtime.dist, "device_id": runtime.gpu_id,
              "pipelines": args.pipelines}
    train_loader = create_video_loader(train_src, train=True, hflip=args.hflip, checkpointing=True,
                                       clips_per_read=args.clips_per_read, **common)
    val_loader = create_video_loader(val_src, train=False, **common)
    return train_loader, val_loader, num_classes, names


def main(args: argparse.Namespace) -> dict[str, float]:
    with training_session(engine=args.engine, debug=args.debug) as (runtime, stop):
        return _train(args, runtime, stop)


def _train(args: argparse.Namespace, runtime: Runtime, stop: StopRequest) -> dict[str, float]:
    seed_everything(args.seed)
    ckpt = load_checkpoint(args.resume) if args.resume is not None else None
    backend = choose_backend(args.data_backend, gpu_note="NVDEC", cpu_note="DALI decodes VP8/VP9 on the CPU")
    if args.batch_size is None:  # from the machine: one read per video pipeline on a GPU
        args.batch_size = default_video_batch_size(cuda=runtime.device.type == "cuda")
        log.info("batch %d clips per process (auto: -b sets it)", args.batch_size)
    log.info("rank %d/%d (launcher %s, engine %s), device %s", runtime.dist.rank, runtime.dist.world_size,
             runtime.dist.launcher, runtime.engine, runtime.device)
    train_loader, val_loader, num_classes, class_names = load_data(args, runtime, backend)
    model = create_video_model(args.arch, num_classes=num_classes).to(runtime.device)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    r = start_run(args, runtime, model, train_loader, task="video", metric="val_top1", ckpt=ckpt, backend=backend,
                  num_classes=num_classes, class_names=class_names, reference_batch=None, warmup_start_factor=0.04,
                  start={"clip_len": args.clip_len, "frame_stride": args.frame_stride,
                         "pipelines": getattr(train_loader, "pipelines", 1),
                         "clips_per_read": getattr(train_loader, "unfold", 1)})
    if args.test_only:
        stats = evaluate(r.ddp_model, criterion, val_loader, runtime=runtime, amp=r.amp, num_classes=num_classes)
        log.info("test: val loss %.4f top1 %.2f over %d clips", stats["val_loss"], stats["val_top1"],
                 stats["val_samples"])
        r.metrics.write(event="test", **stats)
        return stats

    tracker = r.tracker(stop, unit="clips")
    stats: dict[str, float] = {}
    while r.state.epoch < args.epochs:
        stats = train_one_epoch(r.ddp_model, criterion, r.optimizer, r.scheduler, train_loader, amp=r.amp, tracker=tracker,
                                runtime=runtime)
        stats |= evaluate(r.ddp_model, criterion, val_loader, runtime=runtime, amp=r.amp, num_classes=num_classes)
        tracker.end_epoch(stats)
    r.finish(unit="clips")
    return stats


if __name__ == "__main__":
    run(main, get_args_parser())
