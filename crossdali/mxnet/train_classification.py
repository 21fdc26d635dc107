"""Train an image classifier (Gluon ResNet-50 v1 by default) on DALI-fed MXNet batches.

    python -m crossdali.mxnet.train_classification                    # sample data, auto backend
    python -m crossdali.mxnet.launch -n 2 -- python -m crossdali.mxnet.train_classification --data /imagenet
    horovodrun -np 8 python -m crossdali.mxnet.train_classification --data /imagenet   # if horovod.mxnet imports

Same shape and flags as ``crossdali.pytorch.train_classification``: ``--arch`` takes Gluon's
model zoo names and torchvision's ResNet/MobileNet/SqueezeNet/Inception names (checked before any
data is read); ``--amp`` is MXNet's AMP (float16) on a CUDA GPU and float32 on the CPU wheel;
``--channels-last`` is accepted and stays NCHW (said at start-up: see ``CHANNELS_LAST_NOTE``).
Without ``--data`` it builds the embedded sample set (if missing).

``--multi-label`` trains on a multi-label list (``train.txt``/``val.txt``: an image path and its
labels per line; without ``--data`` the multi-label sample set) with sigmoid + binary
cross-entropy, val mAP and macro F1 (the best checkpoint is the best mAP), as the PyTorch and JAX
scripts do; the lists go through ``crossdali.mxnet.create_multilabel_loader``.

Checkpoints (rank 0, at epoch ends): ``checkpoint.params`` (weights), ``.states`` (optimizer) and
``.json`` (``crossdali.common.scripts.runs.checkpoint_meta``: class names, arch, epochs done, val top-1,
the full config), what ``--resume`` takes; and ``checkpoint_best.params``/``.states``/``.json``, the
same from the epoch of the best val top-1.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from pathlib import Path

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from crossdali.common.data.sample_data import ensure_classification, ensure_multilabel
from crossdali.common.data.sources import resolve_source
from crossdali.common.errors import WriteError
from crossdali.common.models import builder_name, models_for
from crossdali.common.scripts import script_parsers
from crossdali.common.scripts.defaults import resolve_defaults
from crossdali.common.scripts.metrics import format_test_line, val_stats
from crossdali.common.scripts.runs import (
    BestCheckpoint,
    StepLog,
    checkpoint_meta,
    choose_run_dir,
    epoch_line,
    finish_run,
    label_names,
    open_metrics,
    write_json,
)
from crossdali.common.scripts.script import run
from crossdali.common.scripts.train_args import (
    log_accepted_flags,
    resolve_auto_augment,
    resolve_backend,
    resolve_num_classes,
)
from crossdali.mxnet.distributed import Runtime, init_distributed
from crossdali.mxnet.loaders import create_classification_loader

log = logging.getLogger("crossdali.train")

#: ``gluon.model_zoo.vision.get_model``'s names that ``--arch`` reaches (``crossdali.common.models``: the
#: shared names, e.g. resnet50 -> resnet50_v1, and Gluon's own; tests/mxnet/test_mxnet_train.py checks them
#: against the zoo and builds every one). Gluon's v1 ResNets put the stride of a bottleneck on its first 1x1
#: convolution, torchvision's (v1.5) on the 3x3: ResNet-50 and deeper differ in that detail.
GLUON_ARCHS = tuple(builder_name(name, "mxnet") for name in models_for("mxnet"))
#: What ``--channels-last`` does here, said at start-up.
CHANNELS_LAST_NOTE = (
    "--channels-last: not applied, the model runs NCHW. MXNet takes NHWC convolutions only through cuDNN on "
    "a CUDA GPU (its CPU operator: 'Only support NCW, NCHW and NCDHW layout'), and Gluon's model zoo builds "
    "NCHW models only (its constructors take no layout)")


def resolve_arch(arch: str) -> str:
    """The Gluon model name for ``--arch``: a name of ``crossdali.common.models`` that MXNet has, or
    Gluon's own spelling of it (``ModelNameError`` otherwise, naming the closest)."""
    return builder_name(arch, "mxnet")


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    """This script's flags, defined framework-free (``crossdali.common.scripts.script_parsers``) so that
    ``crossdali train classification --framework mxnet --help`` answers before MXNet loads."""
    return script_parsers.mxnet_classification(add_help=add_help)


def accuracy_counts(output: np.ndarray, target: np.ndarray, topk=(1, 5)) -> list[int]:
    """Number of samples whose target is among the top-k predictions, for each k."""
    maxk = min(max(topk), output.shape[1])
    pred = np.argsort(-output, axis=1, kind="stable")[:, :maxk]
    correct = pred == target.reshape(-1, 1).astype(np.int64)
    return [int(correct[:, : min(k, maxk)].any(axis=1).sum()) for k in topk]


def _real_rows(batch: mx.io.DataBatch) -> tuple[mx.nd.NDArray, mx.nd.NDArray, int]:
    """Images and labels without the ``pad`` trailing rows of MXNet's last batch.

    Training on the padding would repeat a sample and, worse, skew BatchNorm's batch statistics
    (up to batch_size - 1 copies of one image), so the padded rows are cut off, not masked.
    """
    images, labels = batch.data[0], batch.label[0]
    valid = images.shape[0] - (batch.pad or 0)
    if valid < images.shape[0]:
        images, labels = images[:valid], labels[:valid]
    return images, labels, valid


def train_one_epoch(net, loss_fn, trainer, loader, *, runtime: Runtime, amp: bool, steps: StepLog) -> dict[str, float]:
    ctx = runtime.context
    loss_sum, seen, data_wait = 0.0, 0, 0.0
    loader.reset()
    start = time.perf_counter()
    batch_end = start
    for batch in loader:
        wait = time.perf_counter() - batch_end
        data_wait += wait
        images, target, valid = _real_rows(batch)
        images, target = images.as_in_context(ctx), target.as_in_context(ctx)
        with autograd.record():
            loss = loss_fn(net(images), target)
            if amp:  # dynamic loss scaling: the scaled loss is part of the recorded graph
                from mxnet.contrib import amp as mx_amp

                with mx_amp.scale_loss(loss, trainer) as scaled:
                    autograd.backward(scaled)
        if not amp:
            loss.backward()
        trainer.step(valid)
        batch_loss = float(loss.sum().asscalar())  # also waits for the step (MXNet runs ops asynchronously)
        loss_sum += batch_loss
        seen += valid
        now = time.perf_counter()
        steps.update(loss=batch_loss / max(valid, 1), lr=trainer.learning_rate, samples=valid,
                     step_seconds=now - batch_end, data_wait_seconds=wait)
        batch_end = now
    steps.close()
    mx.nd.waitall()
    elapsed = time.perf_counter() - start
    loss_total, seen_total, _ = runtime.all_reduce_sum([loss_sum, seen, data_wait])
    return {"train_loss": loss_total / max(seen_total, 1), "train_img_s": seen_total / elapsed,
            "data_wait_s": data_wait, "train_samples": int(seen_total), "train_seconds": elapsed}


def evaluate(net, loss_fn, loader, *, runtime: Runtime, num_classes: int) -> dict[str, float]:
    """Loss and top-1/top-5 over the whole val set: every sample once across all ranks (top-5 only
    with more than 5 classes)."""
    ctx = runtime.context
    loss_sum, correct1, correct5, seen = 0.0, 0, 0, 0
    start = time.perf_counter()
    loader.reset()
    for batch in loader:
        images, target, valid = _real_rows(batch)
        output = net(images.as_in_context(ctx))
        target = target.as_in_context(ctx)
        loss_sum += float(loss_fn(output, target).sum().asscalar())
        c1, c5 = accuracy_counts(output.asnumpy(), target.asnumpy())
        correct1, correct5, seen = correct1 + c1, correct5 + c5, seen + valid
    loss_sum, correct1, correct5, seen = runtime.all_reduce_sum([loss_sum, correct1, correct5, seen])
    return val_stats(loss_sum=loss_sum, correct1=correct1, correct5=correct5, seen=int(seen),
                     num_classes=num_classes) | {"eval_seconds": time.perf_counter() - start}


def evaluate_multilabel(net, loss_fn, loader, *, runtime: Runtime) -> dict[str, float]:
    """Binary cross-entropy, mAP and macro F1 (sigmoid >= 0.5) over every val sample, each seen once
    across all ranks (``crossdali.common.multilabel.multilabel_metrics``, as the PyTorch and JAX
    scripts): the scores are gathered, since average precision ranks them all."""
    from crossdali.common.multilabel import gathered_multilabel_stats

    ctx = runtime.context
    loss_sum, scores, targets = 0.0, [], []
    start = time.perf_counter()
    loader.reset()
    for batch in loader:
        images, target, _ = _real_rows(batch)
        output = net(images.as_in_context(ctx))
        loss_sum += float(loss_fn(output, target.as_in_context(ctx)).sum().asscalar())
        scores.append(mx.nd.sigmoid(output).asnumpy())
        targets.append(target.asnumpy())
    return gathered_multilabel_stats(loss_sum, scores, targets, num_classes=loader.num_classes, runtime=runtime) \
        | {"eval_seconds": time.perf_counter() - start}


def load_multilabel_data(args, runtime: Runtime, backend: str):
    """``load_data`` for ``--multi-label``: list files through the external-source iterator."""
    from crossdali.common.multilabel import resolve_multilabel_splits
    from crossdali.mxnet.external import create_multilabel_loader

    data = args.data
    if data is None:
        if runtime.dist.is_main:
            ensure_multilabel(size=args.sample_size)
        runtime.barrier()  # other ranks wait for rank 0 to build the sample set
        data = ensure_multilabel(size=args.sample_size)
    train_src, val_src = resolve_multilabel_splits(args, data, backend)
    common = dict(backend=backend, batch_size=args.batch_size, crop_size=args.crop_size, workers=args.workers,
                  py_workers=max(1, args.workers // 2), seed=args.seed, dist=runtime.dist,
                  device_id=runtime.gpu_id)
    train_loader = create_multilabel_loader(train_src, train=True, **common)
    val_loader = create_multilabel_loader(val_src, train=False, **common)
    return train_loader, val_loader, train_src.num_classes, list(train_src.classes)


def load_data(args, runtime: Runtime, backend: str):
    """Train and val iterators over the same dataset, sharded by the global rank, and the class names."""
    auto_augment = resolve_auto_augment(args, backend=backend)  # refused here where nothing would run it
    if args.multi_label:
        return load_multilabel_data(args, runtime, backend)
    data = args.data
    if data is None:
        fmt = "recordio" if backend == "native" else "imagefolder"
        if runtime.dist.is_main:
            ensure_classification(size=args.sample_size)
        runtime.barrier()  # other ranks wait for rank 0 to build the sample set
        data = ensure_classification(size=args.sample_size) / fmt
    common = dict(backend=backend, batch_size=args.batch_size, crop_size=args.crop_size, workers=args.workers,
                  seed=args.seed, dist=runtime.dist, device_id=runtime.gpu_id, dtype="float32",
                  hw_decoder_load=args.hw_decoder_load)
    check = dict(format=args.data_format, exclude=args.exclude, validate=not args.skip_check)
    train_src = resolve_source(data, "train", **check)
    val_src = resolve_source(data, "val", **check)
    train_loader = create_classification_loader(train_src, train=True, auto_augment=auto_augment, **common)
    val_loader = create_classification_loader(val_src, train=False, **common)
    names = label_names(train_src, num_classes=args.num_classes or train_src.num_classes, sample=args.data is None)
    num_classes = resolve_num_classes(args.num_classes, train_src.num_classes or len(names), data_format=train_src.format,
                                      data=data)
    return train_loader, val_loader, num_classes, names


def _use_amp(requested: bool, context: mx.Context) -> bool:
    """MXNet's AMP (float16) where it runs: a CUDA GPU. On the CPU: float32, said at start-up.

    Measured with the CPU wheel (mxnet 1.9.1) on an AVX2 machine: ``amp.init()`` (float16) fails in
    the first dense layer ("FP16 gemm on cpu not implemented!"), ``amp.init(target_dtype="bfloat16")``
    in the first convolution (oneDNN: "could not create a primitive descriptor iterator").
    """
    if not requested:
        return False
    if context.device_type == "gpu":
        from mxnet.contrib import amp as mx_amp

        mx_amp.init()  # before the network is built: AMP rewrites the operators it creates
        log.info("--amp: MXNet AMP, float16 with dynamic loss scaling")
        return True
    log.warning("--amp: not applied on the CPU, training in float32 (MXNet's AMP is float16 on CUDA GPUs; the CPU "
                "wheel has no float16 GEMM, and its bfloat16 convolutions need AVX-512)")
    return False


CHECKPOINT = "checkpoint.params"  # with checkpoint.states (the trainer) and checkpoint.json (checkpoint_meta)


def _checkpoint_paths(params: Path) -> tuple[Path, Path, Path]:
    return params, params.with_suffix(".states"), params.with_suffix(".json")


def _save_atomically(path: Path, save) -> None:
    """``save(filename)`` (Gluon's savers take a name) to a temporary file beside ``path``, then renamed
    over it: a failed write (a full disk, a file-size limit) leaves the previous checkpoint loadable and
    is one line naming the file (``WriteError``)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        save(str(tmp))
        os.replace(tmp, path)
    except (OSError, mx.base.MXNetError) as e:  # MXNet's C++ writer says only "FileStream.Write incomplete"
        cause = getattr(e, "strerror", None) or str(e).strip().splitlines()[-1].removeprefix("MXNetError: ")
        kept = f"; the previous {path.name} is unchanged" if path.is_file() else ""
        raise WriteError(f"cannot write checkpoint {path} (a full disk or a file-size limit?): {cause}{kept}") from e
    finally:
        tmp.unlink(missing_ok=True)


def main(args: argparse.Namespace) -> dict[str, float]:
    try:  # before anything is launched or read: a typo must not cost a data load
        arch = resolve_arch(args.arch)
    except ValueError as e:
        print(f"{Path(sys.argv[0]).name}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    runtime = init_distributed(engine=args.engine)
    logging.basicConfig(level=logging.INFO if runtime.dist.is_main else logging.WARNING,
                        format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    mx.random.seed(args.seed)  # same initial weights on every rank (also broadcast by the engine)
    np.random.seed(args.seed)
    backend = resolve_backend(args.data_backend, gpu="MXNet GPU 0" if mx.context.num_gpus() > 0 else None,
                              cpu_note="MXNet sees no GPU: DALI runs all operators on the CPU",
                              no_gpu="MXNet built with CUDA and a visible GPU (the PyPI mxnet wheel is CPU-only: docs/mxnet.md)")
    if arch != args.arch:
        log.info("--arch %s: Gluon's %s", args.arch, arch)
    log_accepted_flags(args, checkpoint_every="the MXNet script saves at epoch ends only; a run "
                                                                  "killed mid-epoch redoes that epoch")
    if args.channels_last:
        log.warning(CHANNELS_LAST_NOTE)
    defaults = resolve_defaults(args, cuda=runtime.context.device_type == "gpu", world_size=runtime.dist.world_size,
                                layout="NCHW")
    amp = _use_amp(args.amp, runtime.context)
    log.info("rank %d/%d (launcher %s, engine %s), context %s", runtime.dist.rank, runtime.dist.world_size,
             runtime.dist.launcher, runtime.engine, runtime.context)
    train_loader, val_loader, num_classes, class_names = load_data(args, runtime, backend)
    args.num_classes = num_classes  # the saved config then holds what it was resolved to

    net = gluon.model_zoo.vision.get_model(arch, classes=num_classes, pretrained=False)
    net.initialize(mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2), ctx=runtime.context)
    net.hybridize(static_alloc=True)
    # one forward pass gives every parameter its shape (Gluon's deferred initialisation), so the
    # distributed engines can broadcast the initial weights before the first step
    net(mx.nd.zeros((1, 3, args.crop_size, args.crop_size), ctx=runtime.context))
    lr = defaults.lr
    steps_per_epoch = max(1, len(train_loader))
    total = args.epochs * steps_per_epoch
    warmup = min(int(args.lr_warmup_epochs * steps_per_epoch), total - 1)
    schedule = mx.lr_scheduler.CosineScheduler(max_update=max(1, total), base_lr=lr, final_lr=0.0,
                                               warmup_steps=max(0, warmup), warmup_begin_lr=lr * 0.1)
    trainer = runtime.make_trainer(net.collect_params(), "sgd", {
        "learning_rate": lr, "momentum": args.momentum, "wd": args.weight_decay, "lr_scheduler": schedule})
    if amp:
        from mxnet.contrib import amp as mx_amp

        mx_amp.init_trainer(trainer)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    if args.multi_label:
        # one sigmoid per class, the mean over classes per sample (PyTorch's BCEWithLogitsLoss over a batch)
        loss_fn = gluon.loss.SigmoidBinaryCrossEntropyLoss()
        if args.label_smoothing:
            log.warning("--label-smoothing %s: not applied with --multi-label (binary targets)", args.label_smoothing)
    elif args.label_smoothing:
        smooth, dense_ce = args.label_smoothing, gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False)

        def loss_fn(output, target):
            return dense_ce(output, mx.nd.one_hot(target, num_classes) * (1 - smooth) + smooth / num_classes)

    start_epoch = 0
    if args.resume is not None:
        if args.resume.is_dir():  # the run folder: its checkpoint
            args.resume = args.resume / CHECKPOINT
        params, states, meta = _checkpoint_paths(args.resume)
        for path in (params, states, meta):
            if not path.is_file():
                raise FileNotFoundError(f"--resume {args.resume}: {path} does not exist")
        net.load_parameters(str(params), ctx=runtime.context)
        trainer.load_states(str(states))
        saved = json.loads(meta.read_text())
        # checkpoint_meta's epoch counts the epochs done; the older format held the last epoch's index
        start_epoch = saved["epoch"] if "format" in saved else saved["epoch"] + 1
        log.info("resumed from %s at epoch %d", params, start_epoch + 1)

    run_dir = choose_run_dir(args.output_dir, resume=args.resume, task="classification", framework="mxnet", arch=arch)
    about = {"framework": "mxnet", "arch": arch, "num_classes": num_classes, "class_names": class_names,
             "config": args}
    metric = "val_map" if args.multi_label else "val_top1"
    best = BestCheckpoint(run_dir, meta=about, metric=metric, enabled=runtime.dist.is_main)
    best.resume(start_epoch)
    metrics = open_metrics(run_dir, continuing=args.resume is not None, enabled=runtime.dist.is_main)
    log.info("outputs: %s", run_dir)
    metrics.write(event="start", task="classification", arch=arch, backend=backend,
                  precision="float16 (AMP)" if amp else "float32", layout="NCHW", world_size=runtime.dist.world_size,
                  engine=runtime.engine, batch_size=args.batch_size, lr=lr, epochs=args.epochs, framework="mxnet",
                  **(defaults.record() | {"amp": amp}))

    def validate() -> dict[str, float]:
        if args.multi_label:
            return evaluate_multilabel(net, loss_fn, val_loader, runtime=runtime)
        return evaluate(net, loss_fn, val_loader, runtime=runtime, num_classes=num_classes)

    if args.test_only:
        stats = validate()
        log.info(format_test_line(stats))
        metrics.write(event="test", **stats)
        return stats

    stats: dict[str, float] = {}
    for epoch in range(start_epoch, args.epochs):
        steps = StepLog(metrics, epoch=epoch, epochs=args.epochs, total=len(train_loader),
                        world_size=runtime.dist.world_size, enabled=runtime.dist.is_main, print_freq=args.print_freq)
        stats = train_one_epoch(net, loss_fn, trainer, train_loader, runtime=runtime, amp=amp, steps=steps)
        runtime.sync_batchnorm_stats(net)  # several workers: every rank evaluates (rank 0 saves) the same
        stats |= validate()
        if not math.isfinite(stats["train_loss"]):
            raise FloatingPointError(f"training loss is {stats['train_loss']} at epoch {epoch + 1}: lower --lr")
        is_best = best.update(epoch + 1, stats)
        log.info(epoch_line(epoch, args.epochs, stats) + ("  (best)" if is_best else ""))
        metrics.write(event="epoch", epoch=epoch + 1, lr=trainer.learning_rate, **stats)
        if runtime.dist.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            params, states, meta = _checkpoint_paths(run_dir / CHECKPOINT)
            _save_atomically(params, net.save_parameters)
            _save_atomically(states, trainer.save_states)
            write_json(meta, checkpoint_meta(**about, epoch=epoch + 1, stats=stats, metric=metric,
                                              files=[params.name, states.name]))
            if is_best:
                best.save({".params": params, ".states": states}, epoch=epoch + 1, stats=stats)
    if runtime.dist.is_main:
        finish_run(run_dir, metrics=metrics, metric=metric)
    metrics.close()
    return stats


if __name__ == "__main__":
    run(main, get_args_parser())
