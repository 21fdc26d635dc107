"""Train SSD300 (ResNet backbone) on COCO-format data fed by DALI; COCO mAP after every epoch.

    python -m crossdali.detection_ssd.train                                  # sample set, auto backend
    torchrun --nproc_per_node 8 -m crossdali.detection_ssd.train --data /coco -b 64 --epochs 65
    horovodrun -np 8 python -m crossdali.detection_ssd.train --data /coco

Shaped like torchvision's reference scripts. Without ``--data`` it builds the embedded detection
sample set. The backbone starts from random weights: no pretrained weights can be downloaded on
these machines (pass ``--weights-backbone`` with a local torchvision state dict where you can).
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from pathlib import Path

import torch

from crossdali.common.detection import resolve_detection_source
from crossdali.common.metrics import MetricsWriter
from crossdali.common.sample_data import SIZES
from crossdali.common.sample_data.detection import ensure_detection
from crossdali.detection_ssd.coco_eval import coco_map, to_coco_results
from crossdali.detection_ssd.model import SSD300, BoxCoder, MultiBoxLoss, postprocess
from crossdali.pytorch.detection import DETECTION_BACKENDS, create_detection_loader
from crossdali.pytorch.distributed import Runtime, init_distributed

log = logging.getLogger("crossdali.detection")


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="crossdali SSD300 training", add_help=add_help)
    parser.add_argument("--data", type=Path, default=None,
                        help="COCO-format folder (annotations/instances_{train,val}.json, train/, val/); "
                             "default: the embedded sample set (built if missing)")
    parser.add_argument("--sample-size", default="small", choices=sorted(SIZES), help="sample set size without --data")
    parser.add_argument("--data-backend", default="auto", choices=["auto", *DETECTION_BACKENDS])
    parser.add_argument("--arch", default="resnet50", help="torchvision ResNet for the backbone (resnet18/34/50/101)")
    parser.add_argument("--weights-backbone", type=Path, default=None, help="local torchvision state dict for the backbone")
    parser.add_argument("-b", "--batch-size", type=int, default=32, help="images per process per step")
    parser.add_argument("--epochs", type=int, default=65)
    parser.add_argument("--lr", type=float, default=2.6e-3, help="learning rate for a global batch of 32 (scaled linearly)")
    parser.add_argument("--lr-warmup-epochs", type=float, default=1.0, help="linear warm-up, then cosine decay")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--wd", "--weight-decay", dest="weight_decay", type=float, default=5e-4)
    parser.add_argument("-j", "--workers", type=int, default=4, help="DALI threads or DataLoader workers per process")
    parser.add_argument("--hw-decoder-load", type=float, default=1.0, help="share of JPEGs for the hardware decoder")
    parser.add_argument("--amp", action="store_true", help="mixed precision (float16 on GPU, bfloat16 on CPU)")
    parser.add_argument("--engine", default="auto", choices=["auto", "ddp", "horovod", "none"])
    parser.add_argument("--eval-every", type=int, default=1, help="epochs between COCO evaluations")
    parser.add_argument("--resume", type=Path, default=None, help="checkpoint to resume from")
    parser.add_argument("--output-dir", type=Path, default=None, help="checkpoints and metrics.jsonl go here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--print-freq", type=int, default=10, help="steps between progress lines")
    parser.add_argument("--test-only", action="store_true", help="only evaluate (with --resume)")
    return parser


def train_one_epoch(model, criterion, optimizer, scheduler, loader, *, epoch: int, runtime: Runtime, scaler,
                    amp_dtype, print_freq: int) -> dict[str, float]:
    model.train()
    device = runtime.device
    loss_sum, seen, data_wait = 0.0, 0, 0.0
    start = last = batch_end = time.perf_counter()
    for step, (images, offsets, labels) in enumerate(loader):
        data_wait += time.perf_counter() - batch_end
        images, offsets, labels = (x.to(device, non_blocking=True) for x in (images, offsets, labels))
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            locs, scores = model(images)
        loss = criterion(locs, scores, offsets, labels)
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
        loss_sum, seen = loss_sum + float(loss.detach()) * n, seen + n
        if print_freq and (step + 1) % print_freq == 0:
            now = time.perf_counter()
            log.info("epoch %d step %d/%d  loss %.4f  lr %.4g  %.0f img/s  data wait %.2f s", epoch + 1, step + 1,
                     len(loader), loss.item(), scheduler.get_last_lr()[0],
                     print_freq * n * runtime.dist.world_size / (now - last), data_wait)
            last = now
        batch_end = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    loss_total, seen_total = runtime.all_reduce_sum([loss_sum, seen])
    return {"train_loss": loss_total / max(seen_total, 1), "train_img_s": seen_total / elapsed,
            "data_wait_s": data_wait, "train_samples": int(seen_total)}


def _gather(runtime: Runtime, obj: list) -> list:
    """Every rank's list, concatenated (detections for COCO evaluation)."""
    if runtime.engine == "ddp":
        parts = [None] * runtime.dist.world_size
        torch.distributed.all_gather_object(parts, obj)
        return [x for p in parts for x in p]
    if runtime.engine == "horovod":
        import horovod.torch as hvd

        # evaluate() runs in inference mode; Horovod's background thread writes into the tensors
        # it creates, which inference mode forbids ("Inplace update to inference tensor")
        with torch.inference_mode(False):
            return [x for p in hvd.allgather_object(obj) for x in p]
    return obj


@torch.inference_mode()
def evaluate(model, loader, *, runtime: Runtime, coder: BoxCoder, amp_dtype) -> dict[str, float]:
    """COCO box mAP over the whole val split: each rank detects on its shard, all ranks score the union."""
    model.eval()
    records, image_ids = [], []
    start = time.perf_counter()
    for images, _, _, ids in loader:
        with torch.autocast(runtime.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            locs, scores = model(images.to(runtime.device, non_blocking=True))
        detections = [tuple(x.cpu() for x in d) for d in postprocess(locs.float(), scores.float(), coder)]
        records += to_coco_results(loader.source, ids.tolist(), detections)
        image_ids += ids.tolist()
    records, image_ids = _gather(runtime, records), _gather(runtime, image_ids)
    stats = coco_map(loader.source, records, image_ids)
    return {f"val_{k}": v for k, v in stats.items()} | {"val_images": len(image_ids),
                                                         "eval_seconds": time.perf_counter() - start}


def load_data(args, runtime: Runtime, backend: str):
    data = args.data
    if data is None:
        if runtime.dist.is_main:
            ensure_detection(size=args.sample_size)
        runtime.barrier()  # other ranks wait for rank 0 to build the sample set
        data = ensure_detection(size=args.sample_size)
    common = dict(backend=backend, batch_size=args.batch_size, workers=args.workers, seed=args.seed,
                  dist=runtime.dist, device_id=runtime.dist.local_rank, hw_decoder_load=args.hw_decoder_load)
    train_src = resolve_detection_source(data, "train")
    val_src = resolve_detection_source(data, "val")
    if train_src.categories != val_src.categories:
        raise ValueError(f"{train_src.annotations_file} and {val_src.annotations_file} list different categories; "
                         "training labels would not match")
    return (create_detection_loader(train_src, train=True, **common),
            create_detection_loader(val_src, train=False, **common), train_src.num_classes)


def _choose_backend(requested: str) -> str:
    if requested != "auto":
        return requested
    backend = "dali-gpu" if torch.cuda.is_available() else "dali-cpu"
    log.info("data backend: %s", backend + ("" if torch.cuda.is_available() else " (no CUDA GPU visible)"))
    return backend


def main(args: argparse.Namespace) -> dict[str, float]:
    runtime = init_distributed(engine=args.engine)
    logging.basicConfig(level=logging.INFO if runtime.dist.is_main else logging.WARNING,
                        format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.manual_seed(args.seed)
    backend = _choose_backend(args.data_backend)
    log.info("rank %d/%d (launcher %s, engine %s), device %s", runtime.dist.rank, runtime.dist.world_size,
             runtime.dist.launcher, runtime.engine, runtime.device)
    train_loader, val_loader, num_classes = load_data(args, runtime, backend)
    model = SSD300(num_classes, arch=args.arch)
    if args.weights_backbone is not None:
        state = torch.load(args.weights_backbone, map_location="cpu", weights_only=True)
        missing = model.backbone.features.load_state_dict(
            {k: v for k, v in _backbone_keys(state).items()}, strict=False)
        log.info("backbone weights from %s (%d keys not in the file)", args.weights_backbone, len(missing.missing_keys))
    else:
        log.info("backbone %s from random weights (no pretrained weights: none can be downloaded here)", args.arch)
    model.to(runtime.device)
    coder = BoxCoder()
    global_batch = args.batch_size * runtime.dist.world_size
    lr = args.lr * global_batch / 32
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum, weight_decay=args.weight_decay)
    steps = max(1, len(train_loader))
    total = args.epochs * steps
    warmup = min(int(args.lr_warmup_epochs * steps), total - 1)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, total - warmup))
    scheduler = torch.optim.lr_scheduler.SequentialLR(
        optimizer, [torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.01, total_iters=warmup), cosine],
        milestones=[warmup]) if warmup > 0 else cosine
    criterion = MultiBoxLoss()
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
        stats = evaluate(ddp_model, val_loader, runtime=runtime, coder=coder, amp_dtype=amp_dtype)
        log.info("test: mAP %.4f  mAP@0.5 %.4f over %d images", stats["val_map"], stats["val_map50"], stats["val_images"])
        metrics.write(event="test", **stats)
        runtime.shutdown()
        return stats

    stats: dict[str, float] = {}
    for epoch in range(start_epoch, args.epochs):
        stats = train_one_epoch(ddp_model, criterion, optimizer, scheduler, train_loader, epoch=epoch,
                                runtime=runtime, scaler=scaler, amp_dtype=amp_dtype, print_freq=args.print_freq)
        if not math.isfinite(stats["train_loss"]):
            raise FloatingPointError(f"training loss is {stats['train_loss']} at epoch {epoch + 1}: lower --lr")
        line = f"epoch {epoch + 1}/{args.epochs}  train loss {stats['train_loss']:.4f}  {stats['train_img_s']:,.1f} img/s"
        if (epoch + 1) % args.eval_every == 0 or epoch + 1 == args.epochs:
            stats |= evaluate(ddp_model, val_loader, runtime=runtime, coder=coder, amp_dtype=amp_dtype)
            line += f"  val mAP {stats['val_map']:.4f}  mAP@0.5 {stats['val_map50']:.4f}"
        log.info(line)
        metrics.write(event="epoch", epoch=epoch + 1, lr=scheduler.get_last_lr()[0], **stats)
        if args.output_dir is not None and runtime.dist.is_main:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(), "epoch": epoch,
                        "num_classes": num_classes, "args": vars(args)}, args.output_dir / "checkpoint.pth")
    runtime.shutdown()
    return stats


def _backbone_keys(state: dict) -> dict:
    """A torchvision ResNet state dict renamed to ``features.<index>`` of the SSD backbone."""
    order = ["conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3"]
    out = {}
    for k, v in state.items():
        head, _, rest = k.partition(".")
        if head in order:
            out[f"{order.index(head)}.{rest}"] = v
    return out


if __name__ == "__main__":
    main(get_args_parser().parse_args())
