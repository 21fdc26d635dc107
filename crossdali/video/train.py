"""Train a video classifier on DALI-decoded clips (PyTorch).

    python -m crossdali.video.train                          # embedded sample clips, small 3D CNN
    python -m crossdali.video.train --arch r2plus1d_18 --data /kinetics --clip-len 16 --crop-size 112
    torchrun --nproc_per_node 8 -m crossdali.video.train --data /kinetics

Shaped like torchvision's references/video_classification/train.py. Without ``--data`` it builds
the embedded sample set (a photo patch moving up / down / growing / shrinking over a texture:
chance is 25 %, and one frame cannot tell the classes apart) and trains on it.
``--data-backend auto`` picks ``dali-gpu`` (NVDEC) when a GPU is visible, ``dali-cpu`` otherwise.
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from pathlib import Path

import torch

from crossdali.common.metrics import MetricsWriter, format_epoch_line
from crossdali.common.sample_data.video import VIDEO_SIZES, ensure_video
from crossdali.common.video import resolve_video_source
from crossdali.pytorch.distributed import Runtime, init_distributed
from crossdali.pytorch.train_classification import accuracy_counts
from crossdali.pytorch.video import VIDEO_BACKENDS, create_video_loader
from crossdali.video.models import ARCHS, create_video_model

log = logging.getLogger("crossdali.video.train")


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="crossdali video classification training", add_help=add_help)
    parser.add_argument("--data", type=Path, default=None,
                        help="folder with train.txt/val.txt ('<path> <label>' lines) or train/<class>/<video>; "
                             "default: the embedded sample clips (built if missing)")
    parser.add_argument("--sample-size", default="small", choices=sorted(VIDEO_SIZES))
    parser.add_argument("--data-backend", default="auto", choices=["auto", *VIDEO_BACKENDS])
    parser.add_argument("--arch", default="small3d", choices=ARCHS)
    parser.add_argument("--clip-len", type=int, default=8, help="frames per clip (sequence_length)")
    parser.add_argument("--frame-stride", type=int, default=2, help="frames between consecutive clip frames")
    parser.add_argument("--clip-step", type=int, default=None,
                        help="frames between clip starts (default clip-len * frame-stride)")
    parser.add_argument("--crop-size", type=int, default=56)
    parser.add_argument("--hflip", type=float, default=0.5, help="mirror probability (0 if labels are left/right)")
    parser.add_argument("-b", "--batch-size", type=int, default=16, help="clips per process per step")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    parser.add_argument("--wd", "--weight-decay", dest="weight_decay", type=float, default=1e-4)
    parser.add_argument("-j", "--workers", type=int, default=2, help="DALI threads per process")
    parser.add_argument("--amp", action="store_true", help="mixed precision (float16 on GPU, bfloat16 on CPU)")
    parser.add_argument("--engine", default="auto", choices=["auto", "ddp", "horovod", "none"])
    parser.add_argument("--output-dir", type=Path, default=None, help="checkpoint.pth and metrics.jsonl go here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--print-freq", type=int, default=20)
    return parser


def train_one_epoch(model, criterion, optimizer, scheduler, loader, *, epoch: int, runtime: Runtime,
                    amp_dtype, print_freq: int) -> dict[str, float]:
    model.train()
    device = runtime.device
    loss_sum, seen, data_wait = 0.0, 0, 0.0
    start = batch_end = time.perf_counter()
    for step, (clips, target) in enumerate(loader):
        data_wait += time.perf_counter() - batch_end
        clips, target = clips.to(device, non_blocking=True), target.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = criterion(model(clips), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        loss_sum += float(loss.detach()) * clips.shape[0]
        seen += clips.shape[0]
        if print_freq and (step + 1) % print_freq == 0:
            log.info("epoch %d step %d/%d  loss %.4f  lr %.3g", epoch + 1, step + 1, len(loader), float(loss),
                     scheduler.get_last_lr()[0])
        batch_end = time.perf_counter()
    elapsed = time.perf_counter() - start
    loss_total, seen_total = runtime.all_reduce_sum([loss_sum, seen])
    return {"train_loss": loss_total / max(seen_total, 1), "train_img_s": seen_total / elapsed,
            "data_wait_s": data_wait, "train_samples": seen_total, "train_seconds": elapsed}


@torch.inference_mode()
def evaluate(model, criterion, loader, *, runtime: Runtime, amp_dtype) -> dict[str, float]:
    """Loss and top-1 over every val clip, each once across all ranks."""
    model.eval()
    device = runtime.device
    loss_sum, correct1, correct5, seen = 0.0, 0, 0, 0
    for clips, target in loader:
        clips, target = clips.to(device, non_blocking=True), target.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            output = model(clips)
        loss_sum += float(criterion(output.float(), target)) * clips.shape[0]
        c1, c5 = accuracy_counts(output, target)
        correct1, correct5, seen = correct1 + c1, correct5 + c5, seen + clips.shape[0]
    loss_sum, correct1, correct5, seen = runtime.all_reduce_sum([loss_sum, correct1, correct5, seen])
    return {"val_loss": loss_sum / max(seen, 1), "val_top1": 100 * correct1 / max(seen, 1),
            "val_top5": 100 * correct5 / max(seen, 1), "val_samples": int(seen)}


def load_data(args, runtime: Runtime, backend: str):
    """Train and val clip loaders over the same dataset, sharded by the global rank."""
    data = args.data
    if data is None:
        if runtime.dist.is_main:
            ensure_video(size=args.sample_size)
        runtime.barrier()  # other ranks wait for rank 0 to build the sample set
        data = ensure_video(size=args.sample_size)
    train_src, val_src = resolve_video_source(data, "train"), resolve_video_source(data, "val")
    common = {"backend": backend, "batch_size": args.batch_size, "sequence_length": args.clip_len,
              "stride": args.frame_stride, "step": args.clip_step, "crop_size": args.crop_size,
              "workers": args.workers, "seed": args.seed, "dist": runtime.dist, "device_id": runtime.dist.local_rank}
    train_loader = create_video_loader(train_src, train=True, hflip=args.hflip, **common)
    val_loader = create_video_loader(val_src, train=False, **common)
    return train_loader, val_loader, max(train_src.num_classes, val_src.num_classes)


def _choose_backend(requested: str) -> str:
    if requested != "auto":
        return requested
    if torch.cuda.is_available():
        log.info("data backend: dali-gpu (NVDEC on %s)", torch.cuda.get_device_name())
        return "dali-gpu"
    log.info("data backend: dali-cpu (no CUDA GPU visible: DALI decodes VP8/VP9 on the CPU)")
    return "dali-cpu"


def main(args: argparse.Namespace) -> dict[str, float]:
    runtime = init_distributed(engine=args.engine)
    logging.basicConfig(level=logging.INFO if runtime.dist.is_main else logging.WARNING,
                        format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.manual_seed(args.seed)
    backend = _choose_backend(args.data_backend)
    train_loader, val_loader, num_classes = load_data(args, runtime, backend)
    model = create_video_model(args.arch, num_classes=num_classes).to(runtime.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    total = max(1, args.epochs * len(train_loader))
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=total, pct_start=0.15)
    criterion = torch.nn.CrossEntropyLoss()
    amp_dtype = (torch.float16 if runtime.device.type == "cuda" else torch.bfloat16) if args.amp else None
    ddp_model = runtime.wrap_model(model)
    optimizer = runtime.wrap_optimizer(optimizer, model)
    metrics = MetricsWriter(args.output_dir, enabled=runtime.dist.is_main)
    metrics.write(event="start", arch=args.arch, backend=backend, world_size=runtime.dist.world_size,
                  batch_size=args.batch_size, clip_len=args.clip_len, frame_stride=args.frame_stride,
                  num_classes=num_classes, epochs=args.epochs)
    stats: dict[str, float] = {}
    for epoch in range(args.epochs):
        stats = train_one_epoch(ddp_model, criterion, optimizer, scheduler, train_loader, epoch=epoch,
                                runtime=runtime, amp_dtype=amp_dtype, print_freq=args.print_freq)
        stats |= evaluate(ddp_model, criterion, val_loader, runtime=runtime, amp_dtype=amp_dtype)
        if not math.isfinite(stats["train_loss"]):
            raise FloatingPointError(f"training loss is {stats['train_loss']} at epoch {epoch + 1}: lower --lr")
        log.info(format_epoch_line(epoch, args.epochs, stats).replace("img/s", "clips/s"))
        metrics.write(event="epoch", epoch=epoch + 1, lr=scheduler.get_last_lr()[0], **stats)
        if args.output_dir is not None and runtime.dist.is_main:
            torch.save({"model": model.state_dict(), "epoch": epoch, "args": vars(args)},
                       args.output_dir / "checkpoint.pth")
    runtime.shutdown()
    return stats


if __name__ == "__main__":
    main(get_args_parser().parse_args())
