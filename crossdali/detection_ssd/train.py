"""Train SSD300 (ResNet backbone) on COCO-format data fed by DALI; COCO mAP after every epoch.

    python -m crossdali.detection_ssd.train                                  # sample set, auto backend
    torchrun --nproc_per_node 8 -m crossdali.detection_ssd.train --data /coco -b 64 --epochs 65
    horovodrun -np 8 python -m crossdali.detection_ssd.train --data /coco

Shaped like torchvision's reference scripts; the pieces shared with the classification and video
scripts live in ``crossdali.pytorch.training`` (same flags, checkpoints, mid-epoch resume, run
folder: ``runs/detection-pytorch-<arch>-<time>`` by default). Without ``--data`` it builds the
embedded detection sample set. The backbone starts from random weights: no pretrained weights can
be downloaded on these machines (pass ``--weights-backbone`` with a local torchvision state dict
where you can). ``--data-backend synthetic`` trains on one random batch (no COCO evaluation).
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from pathlib import Path

import torch

from crossdali.common.anchors import ssd300_default_boxes
from crossdali.common.data.sample_data.detection import ensure_detection
from crossdali.common.detection import resolve_detection_source
from crossdali.common.errors import UsageError
from crossdali.common.loading.epochs import batch_sizes, choose_last_batch_policy
from crossdali.common.scripts import script_parsers
from crossdali.common.scripts.script import run
from crossdali.detection_ssd.coco_eval import coco_map, to_coco_results
from crossdali.detection_ssd.model import SSD300, BoxCoder, MultiBoxLoss, postprocess
from crossdali.pytorch.detection import create_detection_loader
from crossdali.pytorch.distributed import Runtime
from crossdali.pytorch.training import (
    MixedPrecision,
    StepTracker,
    StopRequest,
    SyntheticBatches,
    build_on_rank0,
    choose_backend,
    gather_objects,
    load_checkpoint,
    seed_everything,
    start_run,
    training_session,
)

log = logging.getLogger("crossdali.detection")


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    """This script's flags, defined framework-free (``crossdali.common.scripts.script_parsers``) so that
    ``crossdali train detection --help`` answers before PyTorch loads."""
    return script_parsers.ssd_detection(add_help=add_help)


def train_one_epoch(model, criterion, optimizer, scheduler, loader, *, amp: MixedPrecision, tracker: StepTracker,
                    runtime: Runtime) -> dict[str, float]:
    model.train()
    device = runtime.device
    for images, offsets, labels in tracker.steps(loader):
        images, offsets, labels = (x.to(device, non_blocking=True) for x in (images, offsets, labels))
        with amp.autocast():
            locs, scores = model(images)
        loss = criterion(locs, scores, offsets, labels)  # in float32: the loss casts its inputs
        amp.backward_step(loss, optimizer)
        scheduler.step()
        tracker.step_done(loss, images.shape[0])
    return tracker.epoch_stats()


@torch.inference_mode()
def evaluate(model, loader, *, runtime: Runtime, coder: BoxCoder, amp: MixedPrecision) -> dict[str, float]:
    """COCO box mAP over the whole val split: each rank detects on its shard, all ranks score the union."""
    model.eval()
    records, image_ids = [], []
    start = time.perf_counter()
    for images, _, _, ids in loader:
        with amp.autocast():
            locs, scores = model(images.to(runtime.device, non_blocking=True))
        detections = [tuple(x.cpu() for x in d) for d in postprocess(locs.float(), scores.float(), coder)]
        records += to_coco_results(loader.source, ids.tolist(), detections)
        image_ids += ids.tolist()
    records = [x for part in gather_objects(runtime, records) for x in part]
    image_ids = [x for part in gather_objects(runtime, image_ids) for x in part]
    stats = coco_map(loader.source, records, image_ids)
    return {f"val_{k}": v for k, v in stats.items()} | {"val_images": len(image_ids),
                                                         "eval_seconds": time.perf_counter() - start}


def _synthetic_loader(source, args, runtime: Runtime) -> SyntheticBatches:
    """One random SSD300 batch (image, encoded boxes with about 1 % positive anchors), as many
    batches per epoch as the real train split would give."""
    g = torch.Generator().manual_seed(args.seed)
    anchors = len(ssd300_default_boxes())
    n = args.batch_size
    labels = torch.randint(1, source.num_classes + 1, (n, anchors), generator=g)
    labels[torch.rand((n, anchors), generator=g) > 0.01] = 0
    batch = (torch.randn((n, 3, 300, 300), generator=g), 0.5 * torch.randn((n, anchors, 4), generator=g), labels)
    policy = choose_last_batch_policy(train=True, num_shards=runtime.dist.world_size)
    sizes = batch_sizes(source.num_samples, batch_size=n, shard_id=runtime.dist.rank,
                        num_shards=runtime.dist.world_size, policy=policy)  # the real loader's, short last one too
    return SyntheticBatches(tuple(t.to(runtime.device) for t in batch), sizes=sizes,
                            num_classes=source.num_classes)


def load_data(args, runtime: Runtime, backend: str):
    """Train and val loaders (val is None for synthetic data), the number of classes and their names."""
    data = args.data
    if data is None:
        data = build_on_rank0(runtime, lambda: ensure_detection(size=args.sample_size))
    check = dict(exclude=args.exclude, validate=not args.skip_check)
    train_src = resolve_detection_source(data, "train", **check)
    val_src = resolve_detection_source(data, "val", **check)
    if train_src.categories != val_src.categories:
        raise UsageError(f"{train_src.annotations_file} and {val_src.annotations_file} list different categories; "
                         "training labels would not match")
    names = [name for _, name in train_src.categories]
    if backend == "synthetic":
        return _synthetic_loader(train_src, args, runtime), None, train_src.num_classes, names
    common = dict(backend=backend, batch_size=args.batch_size, workers=args.workers, seed=args.seed,
                  dist=runtime.dist, device_id=runtime.gpu_id, hw_decoder_load=args.hw_decoder_load)
    return (create_detection_loader(train_src, train=True, checkpointing=True, **common),
            create_detection_loader(val_src, train=False, **common), train_src.num_classes, names)


def main(args: argparse.Namespace) -> dict[str, float]:
    with training_session(engine=args.engine, debug=args.debug) as (runtime, stop):
        return _train(args, runtime, stop)


def _train(args: argparse.Namespace, runtime: Runtime, stop: StopRequest) -> dict[str, float]:
    seed_everything(args.seed)
    if args.eval_every < 1:
        raise UsageError(f"--eval-every must be 1 or more, got {args.eval_every}")
    ckpt = load_checkpoint(args.resume) if args.resume is not None else None
    backend = choose_backend(args.data_backend)
    log.info("rank %d/%d (launcher %s, engine %s), device %s", runtime.dist.rank, runtime.dist.world_size,
             runtime.dist.launcher, runtime.engine, runtime.device)
    train_loader, val_loader, num_classes, class_names = load_data(args, runtime, backend)
    if val_loader is None:
        log.info("synthetic data: no COCO evaluation (mAP needs the real annotations)")
    model = SSD300(num_classes, arch=args.arch)
    if args.weights_backbone is not None:
        state_dict = load_checkpoint_weights(args.weights_backbone)
        missing = model.backbone.features.load_state_dict(_backbone_keys(state_dict), strict=False)
        log.info("backbone weights from %s (%d keys not in the file)", args.weights_backbone, len(missing.missing_keys))
    else:
        log.info("backbone %s from random weights (no pretrained weights: none can be downloaded here)", args.arch)
    model.to(runtime.device)
    coder = BoxCoder()
    criterion = MultiBoxLoss()
    r = start_run(args, runtime, model, train_loader, task="detection", metric="val_map", ckpt=ckpt, backend=backend,
                  num_classes=num_classes, class_names=class_names, reference_batch=32, warmup_start_factor=0.01)
    if args.test_only:
        if val_loader is None:
            raise UsageError("--test-only needs real data (COCO mAP): drop --data-backend synthetic")
        stats = evaluate(r.ddp_model, val_loader, runtime=runtime, coder=coder, amp=r.amp)
        log.info("test: mAP %.4f  mAP@0.5 %.4f over %d images", stats["val_map"], stats["val_map50"], stats["val_images"])
        r.metrics.write(event="test", **stats)
        return stats

    tracker = r.tracker(stop)
    stats: dict[str, float] = {}
    while r.state.epoch < args.epochs:
        stats = train_one_epoch(r.ddp_model, criterion, r.optimizer, r.scheduler, train_loader, amp=r.amp, tracker=tracker,
                                runtime=runtime)
        epoch = r.state.epoch + 1
        if val_loader is not None and math.isfinite(stats["train_loss"]) and (
                epoch % args.eval_every == 0 or epoch == args.epochs):
            stats |= evaluate(r.ddp_model, val_loader, runtime=runtime, coder=coder, amp=r.amp)
        tracker.end_epoch(stats)
    r.finish()
    return stats


def load_checkpoint_weights(path: Path) -> dict:
    """A torchvision state dict from a local file (``weights_only``: tensors only)."""
    if not path.is_file():
        raise UsageError(f"--weights-backbone {path} does not exist")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the user's to fix
        raise UsageError(f"--weights-backbone {path} is not a tensors-only PyTorch state dict ({type(e).__name__}: "
                         f"{str(e).splitlines()[0][:200]})") from None


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
    run(main, get_args_parser())
