"""Train an image classifier (ResNet-50 by default) on DALI-fed batches.

    python -m crossdali.pytorch.train_classification                      # sample data, auto backend
    torchrun --nproc_per_node 8 -m crossdali.pytorch.train_classification --data /imagenet
    horovodrun -np 8 python -m crossdali.pytorch.train_classification --data /imagenet

Shaped like torchvision's references/classification/train.py. Without ``--data`` it builds the
embedded sample set (if missing) and trains on it. ``--data-backend auto`` picks ``dali-gpu`` when
a GPU is visible and ``dali-cpu`` otherwise, and says which.
"""

from __future__ import annotations

import argparse
import logging
import math
import time

import torch
import torchvision

from crossdali.common.metrics import MetricsWriter, format_epoch_line
from crossdali.common.sample_data import ensure_classification
from crossdali.common.sources import resolve_source
from crossdali.common.train_args import add_classification_data_args, add_run_args
from crossdali.pytorch.distributed import Runtime, init_distributed
from crossdali.pytorch.loaders import BACKENDS, create_classification_loader

log = logging.getLogger("crossdali.train")


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="crossdali PyTorch classification training", add_help=add_help)
    add_classification_data_args(parser, backends=BACKENDS, arch="resnet50",
                                 arch_help="any torchvision.models name (resnet18, resnet50, ...)",
                                 workers_help="DALI threads or DataLoader workers per process")
    parser.add_argument("--amp", action="store_true", help="mixed precision (float16 on GPU, bfloat16 on CPU)")
    parser.add_argument("--channels-last", action="store_true", help="NHWC memory format for the model")
    add_run_args(parser, engines=["auto", "ddp", "horovod", "none"],
                 engine_help="gradient averaging; auto: horovod under horovodrun, DDP under torchrun/Slurm",
                 resume_help="checkpoint to resume from")
    return parser


def accuracy_counts(output: torch.Tensor, target: torch.Tensor, topk=(1, 5)) -> list[int]:
    """Number of samples whose target is among the top-k predictions, for each k."""
    maxk = min(max(topk), output.shape[1])
    pred = output.topk(maxk, dim=1).indices
    correct = pred.eq(target.view(-1, 1))
    return [int(correct[:, : min(k, maxk)].any(dim=1).sum()) for k in topk]


def train_one_epoch(model, criterion, optimizer, scheduler, loader, *, epoch: int, runtime: Runtime,
                    scaler, amp_dtype, channels_last: bool, print_freq: int) -> dict[str, float]:
    model.train()
    device = runtime.device
    loss_sum, seen, data_wait = 0.0, 0, 0.0
    start = last = time.perf_counter()
    batch_end = start
    for step, (images, target) in enumerate(loader):
        data_wait += time.perf_counter() - batch_end
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = criterion(model(images), target)
        optimizer.zero_grad()  # set_to_none by default; Horovod's DistributedOptimizer takes no arguments
        scaler.scale(loss).backward()
        if runtime.engine == "horovod" and scaler.is_enabled():
            optimizer.synchronize()  # finish Horovod's allreduce before the scaler reads the gradients
            scaler.unscale_(optimizer)
            with optimizer.skip_synchronize():
                scaler.step(optimizer)
        else:
            scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        n = images.shape[0]
        loss_sum += float(loss.detach()) * n
        seen += n
        if print_freq and (step + 1) % print_freq == 0:
            now = time.perf_counter()
            log.info("epoch %d step %d/%d  loss %.4f  lr %.4g  %.0f img/s  data wait %.2f s",
                     epoch + 1, step + 1, len(loader), float(loss.detach()), scheduler.get_last_lr()[0],
                     print_freq * n * runtime.dist.world_size / (now - last), data_wait)
            last = now
        batch_end = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    loss_total, seen_total, wait_max = runtime.all_reduce_sum([loss_sum, seen, data_wait])
    return {"train_loss": loss_total / max(seen_total, 1), "train_img_s": seen_total / elapsed,
            "data_wait_s": data_wait, "train_samples": seen_total, "train_seconds": elapsed}


@torch.inference_mode()
def evaluate(model, criterion, loader, *, runtime: Runtime, amp_dtype, channels_last: bool) -> dict[str, float]:
    """Loss and top-1/top-5 over the whole val set: every sample once across all ranks."""
    model.eval()
    device = runtime.device
    loss_sum, correct1, correct5, seen = 0.0, 0, 0, 0
    for images, target in loader:
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            output = model(images)
        loss_sum += float(criterion(output.float(), target)) * images.shape[0]
        c1, c5 = accuracy_counts(output, target)
        correct1, correct5, seen = correct1 + c1, correct5 + c5, seen + images.shape[0]
    loss_sum, correct1, correct5, seen = runtime.all_reduce_sum([loss_sum, correct1, correct5, seen])
    return {"val_loss": loss_sum / max(seen, 1), "val_top1": 100 * correct1 / max(seen, 1),
            "val_top5": 100 * correct5 / max(seen, 1), "val_samples": int(seen)}


def load_data(args, runtime: Runtime, backend: str):
    """Train and val loaders over the same dataset, sharded by the global rank."""
    data = args.data
    if data is None:
        if runtime.dist.is_main:
            data = ensure_classification(size=args.sample_size) / "imagefolder"
        runtime.barrier()  # other ranks wait for rank 0 to build the sample set
        data = ensure_classification(size=args.sample_size) / "imagefolder"
    common = dict(backend=backend, batch_size=args.batch_size, crop_size=args.crop_size, workers=args.workers,
                  seed=args.seed, dist=runtime.dist, device_id=runtime.dist.local_rank,
                  dtype="float32", hw_decoder_load=args.hw_decoder_load)
    train_src = resolve_source(data, "train", format=args.data_format)
    val_src = resolve_source(data, "val", format=args.data_format)
    train_loader = create_classification_loader(train_src, train=True, **common)
    val_loader = create_classification_loader(val_src, train=False, **common)
    num_classes = args.num_classes or train_src.num_classes
    if not num_classes:
        raise ValueError(f"cannot tell the number of classes of {train_src.format} data at {data}: pass --num-classes")
    return train_loader, val_loader, num_classes


def _choose_backend(requested: str) -> str:
    if requested != "auto":
        return requested
    if torch.cuda.is_available():
        log.info("data backend: dali-gpu (DALI mixed decoder on %s)", torch.cuda.get_device_name())
        return "dali-gpu"
    log.info("data backend: dali-cpu (no CUDA GPU visible: DALI runs all operators on the CPU)")
    return "dali-cpu"


def main(args: argparse.Namespace) -> dict[str, float]:
    runtime = init_distributed(engine=args.engine)
    logging.basicConfig(level=logging.INFO if runtime.dist.is_main else logging.WARNING,
                        format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.manual_seed(args.seed)
    backend = _choose_backend(args.data_backend)
    log.info("rank %d/%d (launcher %s, engine %s), device %s", runtime.dist.rank, runtime.dist.world_size,
             runtime.dist.launcher, runtime.engine, runtime.device)
    train_loader, val_loader, num_classes = load_data(args, runtime, backend)

    model = torchvision.models.get_model(args.arch, weights=None, num_classes=num_classes).to(runtime.device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    global_batch = args.batch_size * runtime.dist.world_size
    lr = args.lr * global_batch / 256
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum, weight_decay=args.weight_decay)
    steps_per_epoch = max(1, len(train_loader))
    warmup = min(int(args.lr_warmup_epochs * steps_per_epoch), args.epochs * steps_per_epoch - 1)
    total = args.epochs * steps_per_epoch
    schedulers = [torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, total - warmup))]
    if warmup > 0:
        schedulers.insert(0, torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=warmup))
    scheduler = torch.optim.lr_scheduler.SequentialLR(optimizer, schedulers, milestones=[warmup]) \
        if warmup > 0 else schedulers[0]
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    amp_dtype = (torch.float16 if runtime.device.type == "cuda" else torch.bfloat16) if args.amp else None
    scaler = torch.amp.GradScaler(runtime.device.type, enabled=args.amp and runtime.device.type == "cuda")

    start_epoch = 0
    if args.resume is not None:
        if not args.resume.is_file():
            raise FileNotFoundError(f"--resume {args.resume} does not exist")
        ckpt = torch.load(args.resume, map_location=runtime.device, weights_only=False)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        scaler.load_state_dict(ckpt["scaler"])
        start_epoch = ckpt["epoch"] + 1
        log.info("resumed from %s at epoch %d", args.resume, start_epoch + 1)

    ddp_model = runtime.wrap_model(model)
    optimizer = runtime.wrap_optimizer(optimizer, model)
    metrics = MetricsWriter(args.output_dir, enabled=runtime.dist.is_main)
    metrics.write(event="start", arch=args.arch, backend=backend, world_size=runtime.dist.world_size,
                  engine=runtime.engine, batch_size=args.batch_size, lr=lr, epochs=args.epochs)

    if args.test_only:
        stats = evaluate(ddp_model, criterion, val_loader, runtime=runtime, amp_dtype=amp_dtype,
                         channels_last=args.channels_last)
        log.info("test: val loss %.4f top1 %.2f top5 %.2f over %d samples", stats["val_loss"],
                 stats["val_top1"], stats["val_top5"], stats["val_samples"])
        metrics.write(event="test", **stats)
        runtime.shutdown()
        return stats

    stats: dict[str, float] = {}
    for epoch in range(start_epoch, args.epochs):
        stats = train_one_epoch(ddp_model, criterion, optimizer, scheduler, train_loader, epoch=epoch,
                                runtime=runtime, scaler=scaler, amp_dtype=amp_dtype,
                                channels_last=args.channels_last, print_freq=args.print_freq)
        stats |= evaluate(ddp_model, criterion, val_loader, runtime=runtime, amp_dtype=amp_dtype,
                          channels_last=args.channels_last)
        if not math.isfinite(stats["train_loss"]):
            raise FloatingPointError(f"training loss is {stats['train_loss']} at epoch {epoch + 1}: lower --lr")
        log.info(format_epoch_line(epoch, args.epochs, stats))
        metrics.write(event="epoch", epoch=epoch + 1, lr=scheduler.get_last_lr()[0], **stats)
        if args.output_dir is not None and runtime.dist.is_main:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
                        "epoch": epoch, "args": vars(args)}, args.output_dir / "checkpoint.pth")
    runtime.shutdown()
    return stats


if __name__ == "__main__":
    main(get_args_parser().parse_args())
