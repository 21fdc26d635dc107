"""Train a flax image classifier (ResNet-50 by default) with optax on DALI-fed ``jax.Array`` batches.

    python -m crossdali.jax.train_classification                         # sample data, auto backend
    python -m crossdali.jax.train_classification --data /imagenet --data-backend dali-gpu -b 256

Same flags as ``crossdali.pytorch.train_classification`` where they apply. Data-parallel over
every device JAX sees (``crossdali.jax.parallel``): one DALI pipeline per device, each batch one
array split over the devices, the weights replicated, the step jitted over the mesh (the gradient is
the mean over all devices' samples); ``-b`` is the batch per device, as per GPU in the other scripts.
Under a launcher (torchrun, Slurm, mpirun, ...) every process joins ``jax.distributed`` and reads
its own shard (docs/jax.md#several-devices-and-processes). The checkpoint (``--output-dir``, one
msgpack file) holds the weights, the optimizer state and the train loader's DALI checkpoint, so
``--resume`` continues the very data stream the run would have seen. ``checkpoint_best.msgpack``
is a copy of it from the epoch of the best val top-1, with ``checkpoint_best.json`` beside it
(class names, arch, epoch, val top-1 and the full config).

``--multi-label`` trains on a multi-label list (``train.txt``/``val.txt``; without ``--data`` the
multi-label sample set) with sigmoid + binary cross-entropy, val mAP and macro F1 (the best
checkpoint by mAP), as the PyTorch script does.
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from functools import partial
from pathlib import Path
from typing import Any

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state
from jax.sharding import PartitionSpec

from crossdali.common.data.sample_data import ensure_classification, ensure_multilabel
from crossdali.common.data.sources import resolve_source
from crossdali.common.distributed import detect_distributed
from crossdali.common.errors import UsageError
from crossdali.common.files import write_atomically
from crossdali.common.loading.cuda_queues import VARIABLE as CUDA_QUEUES_VARIABLE
from crossdali.common.loading.cuda_queues import share_gpu_with_dali
from crossdali.common.scripts import script_parsers
from crossdali.common.scripts.defaults import local_process_count, resolve_defaults
from crossdali.common.scripts.metrics import format_test_line, val_stats
from crossdali.common.scripts.runs import (
    BestCheckpoint,
    ReadBehind,
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
from crossdali.jax.loaders import PADDING_LABEL, create_classification_loader
from crossdali.jax.models import create_model
from crossdali.jax.parallel import AXIS, batch_sharding, initialize_distributed, replicate, replicated

log = logging.getLogger("crossdali.train")

CHECKPOINT = script_parsers.JAX_CHECKPOINT


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    """This script's flags, defined framework-free (``crossdali.common.scripts.script_parsers``) so that
    ``crossdali train classification --framework jax --help`` answers before JAX loads."""
    return script_parsers.jax_classification(add_help=add_help)


class TrainState(train_state.TrainState):
    batch_stats: Any


def make_steps(model, *, num_classes: int, label_smoothing: float, multi_label: bool = False, sharding=None):
    """The jitted train step (state donated: updated in place) and eval step (sums over the batch and
    the count of its samples; multi-label: the summed loss and the sigmoid scores, for mAP over the
    whole val set). With ``sharding`` (the batch split over a mesh, ``crossdali.jax.parallel``) both
    take the state replicated over that mesh and the batch split along it; the results come back
    replicated. Over several devices the train step runs on each device's rows (``jax.shard_map``):
    batch norm normalises by that device's statistics, as DDP and Horovod do in the other scripts,
    and the gradients, loss and updated running statistics are averaged over the devices
    (``lax.pmean``). A val batch's rows labelled ``PADDING_LABEL`` (a sharded loader's padding) count
    for nothing."""
    if sharding is None:
        jit_train, jit_eval = partial(jax.jit, donate_argnums=0), jax.jit
    else:
        whole = replicated(sharding)
        jit_train = partial(jax.jit, donate_argnums=0, in_shardings=(whole, sharding, sharding),
                            out_shardings=(whole, whole))
        jit_eval = partial(jax.jit, in_shardings=(whole, sharding, sharding), out_shardings=whole)

    def loss_fn(params, batch_stats, images, labels):
        logits, updates = model.apply({"params": params, "batch_stats": batch_stats}, images, train=True,
                                      mutable=["batch_stats"])
        if multi_label:  # one sigmoid per class (PyTorch's BCEWithLogitsLoss: the mean over every element)
            return optax.sigmoid_binary_cross_entropy(logits, labels).mean(), updates["batch_stats"]
        targets = optax.smooth_labels(jax.nn.one_hot(labels, num_classes), label_smoothing)
        return optax.softmax_cross_entropy(logits, targets).mean(), updates["batch_stats"]

    def gradients(state: TrainState, images, labels):
        (loss, batch_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, state.batch_stats,
                                                                             images, labels)
        return loss, batch_stats, grads

    if sharding is not None and sharding.mesh.size > 1:
        # per device: XLA would otherwise take batch norm's statistics over the global batch, an
        # all-reduce in every batch-norm layer's forward and backward. check_vma=False: the gradients
        # stay each device's own (as under pmap) until the pmean below averages them
        @partial(jax.jit, donate_argnums=0)
        @partial(jax.shard_map, mesh=sharding.mesh, in_specs=(PartitionSpec(), PartitionSpec(AXIS), PartitionSpec(AXIS)),
                 out_specs=(PartitionSpec(), PartitionSpec()), check_vma=False)
        def train_step(state: TrainState, images, labels):
            loss, batch_stats, grads = jax.lax.pmean(gradients(state, images, labels), AXIS)
            return state.apply_gradients(grads=grads, batch_stats=batch_stats), loss
    else:
        @jit_train
        def train_step(state: TrainState, images, labels):
            loss, batch_stats, grads = gradients(state, images, labels)
            return state.apply_gradients(grads=grads, batch_stats=batch_stats), loss

    @jit_eval
    def eval_step(state: TrainState, images, labels):
        logits = model.apply({"params": state.params, "batch_stats": state.batch_stats}, images, train=False)
        if multi_label:
            return optax.sigmoid_binary_cross_entropy(logits, labels).mean(axis=1).sum(), jax.nn.sigmoid(logits)
        real = labels != PADDING_LABEL
        loss = jnp.where(real, optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(labels, 0)), 0).sum()
        top = jax.lax.top_k(logits, min(5, num_classes))[1]
        return loss, (top[:, 0] == labels).sum(), (top == labels[:, None]).any(axis=1).sum(), real.sum()

    return train_step, eval_step


def train_one_epoch(train_step, state: TrainState, loader, *, device, schedule,
                    steps: StepLog) -> tuple[TrainState, dict[str, float]]:
    """One epoch of ``train_step``. The host reads each step's loss after launching the next step
    (``ReadBehind``). The learning rates come from the host's step count, computed on the CPU once an
    epoch: ``schedule(state.step)`` per step would run behind the queued step on the GPU and wait for it."""
    data_wait = 0.0
    first = int(state.step)  # the previous epoch is finished here: nothing is waited for
    with jax.default_device(jax.local_devices(backend="cpu")[0]):
        lrs = np.asarray(jax.vmap(schedule)(jnp.arange(first, first + max(1, len(loader)))))
    start = time.perf_counter()
    losses = ReadBehind(steps)
    it = iter(loader)
    for k in range(len(loader)):
        t0 = time.perf_counter()
        try:
            images, labels = next(it)
        except StopIteration:
            break
        wait = time.perf_counter() - t0
        data_wait += wait
        if device is not None:  # a no-op for dali-gpu; dali-cpu batches live on JAX's CPU device
            images, labels = jax.device_put((images, labels), device)
        state, loss = train_step(state, images, labels)
        losses.launched(loss, samples=int(images.shape[0]), lr=float(lrs[k]), data_wait_seconds=wait)
    losses.finish()
    steps.close()
    for _ in it:  # a shard may end with a skipped padding-only batch: finish the epoch
        pass
    elapsed = time.perf_counter() - start
    seen = losses.seen
    return state, {"train_loss": losses.loss_sum / max(seen, 1), "train_img_s": seen / elapsed,
                   "data_wait_s": data_wait, "train_samples": seen, "train_seconds": elapsed}


def evaluate(eval_step, state: TrainState, loader, *, device, num_classes: int) -> dict[str, float]:
    """Loss and top-1/top-5 over the whole val set: every sample once (on one device the last batch
    is smaller, which costs one more compilation of ``eval_step``; over several, padding rows count for
    nothing; top-5 only with more than 5 classes)."""
    totals = None  # loss, top-1, top-5, samples: summed on the device, read once at the end
    start = time.perf_counter()
    for images, labels in loader:
        if device is not None:
            images, labels = jax.device_put((images, labels), device)
        sums = eval_step(state, images, labels)
        totals = sums if totals is None else [t + v for t, v in zip(totals, sums, strict=True)]
    loss, top1, top5, seen = (0.0, 0, 0, 0) if totals is None else totals
    return val_stats(loss_sum=float(loss), correct1=int(top1), correct5=int(top5), seen=int(seen),
                     num_classes=num_classes) | {"eval_seconds": time.perf_counter() - start}


def evaluate_multilabel(eval_step, state: TrainState, loader, *, device) -> dict[str, float]:
    """Binary cross-entropy, mAP and macro F1 (sigmoid >= 0.5) over every val sample
    (``crossdali.common.multilabel.multilabel_metrics``, as the PyTorch script)."""
    from crossdali.common.multilabel import multilabel_metrics

    loss_sum, scores, targets, seen = 0.0, [], [], 0
    start = time.perf_counter()
    for images, labels in loader:
        loss, score = eval_step(state, *jax.device_put((images, labels), device))
        loss_sum, seen = loss_sum + float(loss), seen + int(images.shape[0])
        scores.append(np.asarray(score))
        targets.append(np.asarray(labels))
    stats = {"val_loss": loss_sum / max(seen, 1), "val_samples": seen, "eval_seconds": time.perf_counter() - start}
    if not seen:
        return stats
    found = multilabel_metrics(np.concatenate(scores), np.concatenate(targets))
    return stats | {"val_map": found["map"], "val_f1": found["f1"]}


def load_multilabel_data(args, backend: str):
    """``load_data`` for ``--multi-label``: list files through the external-source loader."""
    from crossdali.common.multilabel import resolve_multilabel_splits
    from crossdali.jax.multilabel import create_multilabel_loader

    data = args.data if args.data is not None else ensure_multilabel(size=args.sample_size)
    train_src, val_src = resolve_multilabel_splits(args, data, backend)
    common = dict(backend=backend, batch_size=args.batch_size, crop_size=args.crop_size, workers=args.workers,
                  py_workers=max(1, args.workers // 2), seed=args.seed, layout="HWC")
    train_loader = create_multilabel_loader(train_src, train=True, checkpointing=True, **common)
    val_loader = create_multilabel_loader(val_src, train=False, **common)
    return train_loader, val_loader, train_src.num_classes, list(train_src.classes)


def load_data(args, backend: str, sharding=None):
    """Train and val loaders over the same dataset (the train loader with DALI checkpointing), and
    the class names. ``sharding``: the batch split over several devices (``crossdali.jax.parallel``)."""
    auto_augment = resolve_auto_augment(args, backend=backend)  # refused here where nothing would run it
    if args.multi_label:
        return load_multilabel_data(args, backend)
    data = args.data
    if data is None:
        data = ensure_classification(size=args.sample_size, formats=("imagefolder",)) / "imagefolder"
    common = dict(backend=backend, batch_size=args.batch_size, crop_size=args.crop_size, workers=args.workers,
                  seed=args.seed, hw_decoder_load=args.hw_decoder_load, layout="HWC", sharding=sharding)
    check = dict(format=args.data_format, exclude=args.exclude, validate=not args.skip_check)
    train_src = resolve_source(data, "train", **check)
    val_src = resolve_source(data, "val", **check)
    train_loader = create_classification_loader(train_src, train=True, auto_augment=auto_augment,
                                                checkpointing=backend != "synthetic", **common)
    val_loader = create_classification_loader(val_src, train=False, **common)
    num_classes = resolve_num_classes(args.num_classes, train_src.num_classes, data_format=train_src.format, data=data)
    return train_loader, val_loader, num_classes, label_names(train_src, num_classes=num_classes,
                                                              sample=args.data is None)


def _checkpoint_path(path: Path) -> Path:
    path = path / CHECKPOINT if path.is_dir() else path
    if not path.is_file():
        raise FileNotFoundError(f"--resume {path}: no checkpoint there (expected {CHECKPOINT} written by --output-dir, "
                                "or its folder)")
    return path


def main(args: argparse.Namespace) -> dict[str, float]:
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO, format="%(asctime)s %(message)s",
                        datefmt="%H:%M:%S")
    if not args.debug:  # JAX's own INFO lines (e.g. "Unable to initialize backend 'tpu'") before crossdali's first
        logging.getLogger("jax").setLevel(logging.WARNING)
    dist = detect_distributed()
    queues = share_gpu_with_dali()  # before JAX starts CUDA: hardware queues for DALI's streams beside XLA's
    initialize_distributed(dist)  # several processes: each joins jax.distributed before JAX picks devices
    main_process = jax.process_index() == 0
    if not main_process:
        logging.getLogger().setLevel(logging.WARNING)
    backend = resolve_backend(args.data_backend, gpu=str(jax.devices()[0]) if jax.default_backend() == "gpu" else None,
                              cpu_note=f"JAX's default backend is {jax.default_backend()}: DALI runs all operators on the CPU",
                              no_gpu=f"a CUDA GPU visible to JAX (CPU-only jaxlib? pip install 'jax[cuda13]=={jax.__version__}')")
    devices = jax.device_count()
    # several devices: the batch split over them, the state replicated (no single device to put things on)
    sharding = batch_sharding() if devices > 1 else None
    device = jax.devices()[0] if sharding is None else None
    if sharding is not None and args.multi_label:
        raise UsageError(f"--multi-label trains on one device, and JAX sees {devices} ({jax.process_count()} "
                         "process(es)): make one visible (CUDA_VISIBLE_DEVICES=0, one process)")
    log.info("JAX %s on %s", jax.__version__, device or f"{devices} devices of {jax.process_count()} process(es): "
             f"{', '.join(str(d) for d in jax.devices()[:8])}{' ...' if devices > 8 else ''}")
    defaults = resolve_defaults(args, cuda=jax.default_backend() == "gpu", layout="NHWC", world_size=devices,
                                local_processes=local_process_count(dist.world_size))  # -j: this node's share
    if sharding is not None:
        log.info("data-parallel over %d devices: batch %d per device, %d a step", devices, args.batch_size,
                 args.batch_size * devices)
    if backend == "dali-gpu":
        log.info("%s=%s (CUDA hardware queues: DALI's streams beside XLA's)", CUDA_QUEUES_VARIABLE, queues)
    log_accepted_flags(args, channels_last="the flax models here are NHWC already",
                       checkpoint_every=f"the JAX script saves {CHECKPOINT} at epoch ends only; a run killed "
                                        "mid-epoch redoes that epoch")
    train_loader, val_loader, num_classes, class_names = load_data(args, backend, sharding)
    args.num_classes = num_classes  # the saved config then holds what it was resolved to

    model = create_model(args.arch, num_classes=num_classes, dtype=jnp.bfloat16 if args.amp else jnp.float32)
    base_lr = defaults.lr
    steps_per_epoch = max(1, len(train_loader))
    total = args.epochs * steps_per_epoch
    warmup = max(1, min(int(args.lr_warmup_epochs * steps_per_epoch), total - 1))
    # linear warm-up from 10 %, then cosine decay, per step (the PyTorch script's schedule)
    schedule = optax.join_schedules([optax.linear_schedule(0.1 * base_lr, base_lr, warmup),
                                     optax.cosine_decay_schedule(base_lr, max(1, total - warmup))], [warmup])
    tx = optax.chain(optax.add_decayed_weights(args.weight_decay), optax.sgd(schedule, momentum=args.momentum))
    dummy = jnp.zeros((1, args.crop_size, args.crop_size, 3), jnp.float32)
    variables = jax.jit(partial(model.init, train=False))(jax.random.key(args.seed), dummy)
    state = TrainState.create(apply_fn=model.apply, params=variables["params"], tx=tx,
                              batch_stats=variables["batch_stats"])
    start_epoch = 0
    if args.resume is not None:
        path = _checkpoint_path(args.resume)
        saved = flax.serialization.msgpack_restore(path.read_bytes())
        state = flax.serialization.from_state_dict(state, saved["state"])
        start_epoch = int(saved["epoch"])
        if saved.get("loader") and hasattr(train_loader, "load_state_dict"):
            train_loader.load_state_dict(saved["loader"])
        log.info("resumed from %s at epoch %d", path, start_epoch + 1)
    state = jax.device_put(state, device) if sharding is None else replicate(state, replicated(sharding))

    run_dir = choose_run_dir(args.output_dir, resume=args.resume, task="classification", framework="jax",
                             arch=args.arch)
    metric = "val_map" if args.multi_label else "val_top1"
    best = BestCheckpoint(run_dir, metric=metric, enabled=main_process,
                          meta={"framework": "jax", "arch": args.arch, "num_classes": num_classes,
                                "class_names": class_names, "config": args})
    best.resume(start_epoch)
    metrics = open_metrics(run_dir, continuing=args.resume is not None, enabled=main_process)
    log.info("outputs: %s", run_dir)
    metrics.write(event="start", task="classification", framework="jax", arch=args.arch, backend=backend,
                  world_size=jax.process_count(), devices=devices, batch_size=args.batch_size, lr=base_lr,
                  epochs=args.epochs, device=str(device or jax.devices()[0]),
                  cuda_queues=queues if jax.default_backend() == "gpu" else None, **defaults.record())
    train_step, eval_step = make_steps(model, num_classes=num_classes, label_smoothing=args.label_smoothing,
                                       multi_label=args.multi_label, sharding=sharding)

    def validate() -> dict[str, float]:
        if args.multi_label:
            return evaluate_multilabel(eval_step, state, val_loader, device=device)
        return evaluate(eval_step, state, val_loader, device=device, num_classes=num_classes)

    if args.test_only:
        stats = validate()
        log.info(format_test_line(stats))
        metrics.write(event="test", **stats)
        return stats

    stats: dict[str, float] = {}
    for epoch in range(start_epoch, args.epochs):
        steps = StepLog(metrics, epoch=epoch, epochs=args.epochs, total=steps_per_epoch, print_freq=args.print_freq,
                        enabled=main_process)
        state, stats = train_one_epoch(train_step, state, train_loader, device=device, schedule=schedule, steps=steps)
        stats |= validate()
        if not math.isfinite(stats["train_loss"]):
            raise FloatingPointError(f"training loss is {stats['train_loss']} at epoch {epoch + 1}: lower --lr")
        is_best = best.update(epoch + 1, stats)
        log.info(epoch_line(epoch, args.epochs, stats) + ("  (best)" if is_best else ""))
        metrics.write(event="epoch", epoch=epoch + 1, lr=float(schedule((epoch + 1) * steps_per_epoch - 1)), **stats)
        # several processes: each reads its own shard, so process 0's DALI state is no other's; the run
        # resumes at the epoch's start, in a fresh run's order
        loader_state = train_loader.state_dict() if jax.process_count() == 1 else {"epoch": train_loader.epoch}
        saved = {"state": flax.serialization.to_state_dict(jax.device_get(state)), "epoch": epoch + 1,
                 "loader": loader_state}
        if not main_process:
            continue
        write_atomically(run_dir / CHECKPOINT, lambda f, s=saved: f.write(flax.serialization.msgpack_serialize(s)),
                         what="checkpoint")  # a failed write: WriteError (one line), the previous checkpoint kept
        write_json(run_dir / "checkpoint.json", checkpoint_meta(**best.meta, epoch=epoch + 1, stats=stats, metric=metric,
                                                                files=[CHECKPOINT]))
        if is_best:
            best.save({".msgpack": run_dir / CHECKPOINT}, epoch=epoch + 1, stats=stats)
    if main_process:
        finish_run(run_dir, metrics=metrics, metric=metric)
    metrics.close()
    return stats


if __name__ == "__main__":
    run(main, get_args_parser())
