"""Train a Keras image classifier (ResNet-50 by default) on DALI-fed batches.

    python -m crossdali.tensorflow.train_classification                  # sample data, auto backend
    horovodrun -np 8 python -m crossdali.tensorflow.train_classification --data /imagenet

Same flags as ``crossdali.pytorch.train_classification`` where they apply. The loop is a plain
``tf.GradientTape`` step rather than ``model.fit``: it measures data wait per step, iterates the
loader itself (one DALI iterator across epochs; ``dali-gpu`` batches stay on the GPU, which
``model.fit`` over ``loader.dataset`` would not give), and uses Horovod's framework-level API
(``grouped_allreduce`` of the gradients), which works with Keras 3, where ``horovod.keras`` does
not (TF >= 2.16).

``--multi-label`` trains on a multi-label list (``train.txt``/``val.txt``; without ``--data`` the
multi-label sample set) with sigmoid + binary cross-entropy, val mAP and macro F1 (the best
checkpoint is the best mAP), as the PyTorch, JAX and MXNet scripts do; the lists go through
``crossdali.tensorflow.external.create_multilabel_loader``.

Multi-process: one process per GPU, set up by ``crossdali.tensorflow.distributed`` (Horovod under
a launcher, ``MultiWorkerMirroredStrategy`` with ``TF_CONFIG``), data sharded by the global rank.

Checkpoints (rank 0, at epoch ends): ``ckpt-N`` (the last two, what ``--resume`` takes) and
``checkpoint_best`` (``.index`` + ``.data-*``: the weights, optimizer and epoch of the best val
top-1; load with ``tf.train.Checkpoint(model=model).read(prefix).expect_partial()``, or
``--resume DIR/checkpoint_best --test-only``) with ``checkpoint_best.json`` beside it: class names,
arch, epoch, val top-1 and the full config.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import shutil
import time
from pathlib import Path

import tensorflow as tf

from crossdali.common.data.sample_data import ensure_classification, ensure_multilabel
from crossdali.common.data.sources import resolve_source
from crossdali.common.errors import WriteError
from crossdali.common.loading.background import fetch_ahead
from crossdali.common.loading.cuda_queues import VARIABLE as CUDA_QUEUES_VARIABLE
from crossdali.common.models import builder_name, canonical_name
from crossdali.common.scripts import script_parsers
from crossdali.common.scripts.defaults import resolve_defaults
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
from crossdali.tensorflow.distributed import Runtime, init_distributed
from crossdali.tensorflow.loaders import create_classification_loader

log = logging.getLogger("crossdali.train")


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    """This script's flags, defined framework-free (``crossdali.common.scripts.script_parsers``) so that
    ``crossdali train classification --framework tensorflow --help`` answers before TensorFlow loads."""
    return script_parsers.tensorflow_classification(add_help=add_help)


def create_model(arch: str, *, num_classes: int, crop_size: int) -> tf.keras.Model:
    """A Keras model with random weights: ``arch`` is a name of ``crossdali.common.models`` (or an
    alias, such as Keras' own ``mobilenetv2``) that TensorFlow has. ``small_cnn`` is a 4-layer net for
    fast CPU tests."""
    shape = (crop_size, crop_size, 3)
    name = builder_name(arch, "tensorflow")
    if name == "small_cnn":
        layers = tf.keras.layers
        inputs = tf.keras.Input(shape)
        x = inputs
        for width in (32, 64, 128, 256):
            x = layers.Conv2D(width, 3, strides=2, padding="same", use_bias=False)(x)
            x = layers.BatchNormalization()(x)
            x = layers.ReLU()(x)
        x = layers.GlobalAveragePooling2D()(x)
        outputs = layers.Dense(num_classes, dtype="float32")(x)
        return tf.keras.Model(inputs, outputs, name="small_cnn")
    base = getattr(tf.keras.applications, name)(weights=None, include_top=False, input_shape=shape, pooling="avg")
    outputs = tf.keras.layers.Dense(num_classes, dtype="float32", name="predictions")(base.output)
    return tf.keras.Model(base.input, outputs, name=canonical_name(arch))


def lr_at(step: int, *, base_lr: float, warmup: int, total: int) -> float:
    """Linear warm-up from 10% then cosine decay, per step (PyTorch script's schedule)."""
    if step < warmup:
        return base_lr * (0.1 + 0.9 * step / warmup)
    progress = (step - warmup) / max(1, total - warmup)
    return base_lr * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def resolve_jit_compile(choice: str, *, on_gpu: bool, runtime: Runtime) -> bool:
    """``--jit-compile``: auto compiles where Keras' ``model.fit`` would (a GPU, one process)."""
    if choice != "auto":
        return choice == "on"
    return on_gpu and runtime.hvd is None and runtime.strategy is None


def make_train_step(model, optimizer, loss_fn, runtime: Runtime, *, jit_compile: bool = False):
    """One training step as a ``tf.function``; with ``jit_compile`` XLA compiles it. Keras 3's batch
    norm is not fused: a float32 copy of the activation, its moments, then the normalisation, each a
    pass over memory (and their gradients again), which XLA fuses.
    Distributed, only the gradients are compiled: Horovod's allreduce and tf.distribute's collectives
    are not XLA ops, so the averaging and the optimizer run outside the compiled part."""
    hvd, strategy = runtime.hvd, runtime.strategy
    replicas = strategy.num_replicas_in_sync if strategy is not None else 1

    def loss_and_grads(images, labels):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = loss_fn(labels, logits)
            # tf.distribute sums gradients over replicas: scale so the sum is the mean
            scaled = optimizer.scale_loss(loss / replicas)
        return loss, tape.gradient(scaled, model.trainable_variables)

    distributed = hvd is not None or strategy is not None
    if jit_compile and distributed:
        loss_and_grads = tf.function(loss_and_grads, jit_compile=True, reduce_retracing=True)

    def step(images, labels):
        loss, grads = loss_and_grads(images, labels)
        if hvd is not None:
            # averaged explicitly: hvd.DistributedGradientTape needs tf.Variables (.ref()), and
            # Keras 3 variables are not
            grads = hvd.grouped_allreduce(grads, op=hvd.Average)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    if strategy is None:
        # one process: the whole step (the optimizer's update too) is one XLA program
        return tf.function(step, jit_compile=jit_compile and not distributed, reduce_retracing=True)

    @tf.function(reduce_retracing=True)
    def distributed_step(images, labels):  # each worker feeds its own shard to its one replica
        per_replica = strategy.run(step, args=(images, labels))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica, axis=None)

    return distributed_step


def train_one_epoch(train_step, optimizer, loader, *, step0: int, schedule, runtime: Runtime,
                    steps: StepLog, fetch_ahead_batches: int = 0, read_loss_every: int = 1) -> dict[str, float]:
    """One epoch. The host reads the step losses after launching the next step (``ReadBehind``, as the
    PyTorch and JAX scripts do), in blocks of ``read_loss_every`` steps (``--read-loss-every``): TensorFlow's
    copy of a loss to the host waits for the step just launched too, so each read leaves the GPU idle while
    the host takes the next batch, sets the learning rate and launches the step.

    ``fetch_ahead_batches`` > 0: a background thread fetches the batches (``--fetch-ahead``). With
    ``--handover dataset``, ``DALIDataset``'s next() copies the batch on TensorFlow's compute stream and
    waits for that stream, so fetched here it waits for the steps already queued; from the thread it
    waits beside them. ``--handover dlpack`` (the default where it can) waits for DALI's stream only
    (docs/tensorflow.md#the-hand-over)."""
    data_wait = 0.0
    start = time.perf_counter()
    losses = ReadBehind(steps, every=read_loss_every)
    total = len(loader)  # before the thread starts taking batches
    it = fetch_ahead(loader, fetch_ahead_batches)
    try:
        for step in range(total):
            t0 = time.perf_counter()
            try:
                images, labels = next(it)
            except StopIteration:
                break
            wait = time.perf_counter() - t0
            data_wait += wait
            lr = schedule(step0 + step)
            optimizer.learning_rate.assign(lr)  # ordered after the queued step's use of the rate
            loss = train_step(images, labels)
            losses.launched(loss, samples=int(images.shape[0]), lr=lr, data_wait_seconds=wait)
        losses.finish()
    finally:
        it.close()
    steps.close()
    elapsed = time.perf_counter() - start
    loss_total, seen_total = runtime.all_reduce_sum([losses.loss_sum, losses.seen])
    return {"train_loss": loss_total / max(seen_total, 1), "train_img_s": seen_total / elapsed,
            "data_wait_s": data_wait, "train_samples": int(seen_total), "train_seconds": elapsed}


def make_eval_step(model):
    @tf.function(reduce_retracing=True)  # the last val batch is smaller
    def eval_step(images, labels):
        logits = tf.cast(model(images, training=False), tf.float32)
        loss = tf.reduce_sum(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        k5 = min(5, logits.shape[-1])
        top1 = tf.reduce_sum(tf.cast(tf.math.in_top_k(labels, logits, 1), tf.float32))
        top5 = tf.reduce_sum(tf.cast(tf.math.in_top_k(labels, logits, k5), tf.float32))
        return loss, top1, top5

    return eval_step


def evaluate(eval_step, loader, *, runtime: Runtime, num_classes: int) -> dict[str, float]:
    """Loss and top-1/top-5 over the whole val set: every sample once across all ranks (top-5 only
    with more than 5 classes)."""
    loss_sum = c1 = c5 = seen = 0.0
    start = time.perf_counter()
    for images, labels in loader:
        loss, top1, top5 = eval_step(images, labels)
        loss_sum, c1, c5, seen = loss_sum + float(loss), c1 + float(top1), c5 + float(top5), seen + int(images.shape[0])
    loss_sum, c1, c5, seen = runtime.all_reduce_sum([loss_sum, c1, c5, seen])
    return val_stats(loss_sum=loss_sum, correct1=c1, correct5=c5, seen=int(seen), num_classes=num_classes) | {
        "eval_seconds": time.perf_counter() - start}


def make_multilabel_eval_step(model):
    @tf.function(reduce_retracing=True)  # the last val batch is smaller
    def eval_step(images, labels):
        logits = tf.cast(model(images, training=False), tf.float32)
        per_sample = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits), axis=1)
        return tf.reduce_sum(per_sample), tf.sigmoid(logits)

    return eval_step


def evaluate_multilabel(eval_step, loader, *, runtime: Runtime) -> dict[str, float]:
    """Binary cross-entropy, mAP and macro F1 (sigmoid >= 0.5) over every val sample, each seen once
    across all ranks (``crossdali.common.multilabel.multilabel_metrics``, as the other scripts):
    the scores are gathered, since average precision ranks them all."""
    from crossdali.common.multilabel import gathered_multilabel_stats

    loss_sum, scores, targets = 0.0, [], []
    start = time.perf_counter()
    for images, labels in loader:
        loss, score = eval_step(images, labels)
        loss_sum += float(loss)
        scores.append(score.numpy())
        targets.append(labels.numpy())
    return gathered_multilabel_stats(loss_sum, scores, targets, num_classes=loader.num_classes, runtime=runtime) \
        | {"eval_seconds": time.perf_counter() - start}


def load_multilabel_data(args, runtime: Runtime, backend: str):
    """``load_data`` for ``--multi-label``: list files through the external-source loader."""
    from crossdali.common.multilabel import resolve_multilabel_splits
    from crossdali.tensorflow.external import create_multilabel_loader

    data = args.data if args.data is not None else ensure_multilabel(size=args.sample_size)
    train_src, val_src = resolve_multilabel_splits(args, data, backend)
    common = dict(backend=backend, batch_size=args.batch_size, crop_size=args.crop_size, workers=args.workers,
                  seed=args.seed, dist=runtime.dist, device_id=runtime.gpu_id, layout="HWC")
    train_loader = create_multilabel_loader(train_src, train=True, **common)
    val_loader = create_multilabel_loader(val_src, train=False, **common)
    return train_loader, val_loader, train_src.num_classes, list(train_src.classes)


def load_data(args, runtime: Runtime, backend: str):
    """Train and val loaders over the same dataset, sharded by the global rank, and the class names."""
    auto_augment = resolve_auto_augment(args, backend=backend)  # refused here where nothing would run it
    if args.multi_label:
        return load_multilabel_data(args, runtime, backend)
    data = args.data
    if data is None:
        # every rank builds or reuses the sample set; the build writes to a temporary folder and
        # renames it into place, so concurrent builders never see a partial set
        data = ensure_classification(size=args.sample_size, formats=("imagefolder",)) / "imagefolder"
    common = dict(backend=backend, batch_size=args.batch_size, crop_size=args.crop_size, workers=args.workers,
                  seed=args.seed, dist=runtime.dist, device_id=runtime.gpu_id,
                  hw_decoder_load=args.hw_decoder_load, layout="HWC")
    check = dict(format=args.data_format, exclude=args.exclude, validate=not args.skip_check)
    train_src = resolve_source(data, "train", **check)
    val_src = resolve_source(data, "val", **check)
    # --handover dlpack: a batch's DALI buffers must outlive the step that reads it. Handed out but not yet
    # known done: up to read-loss-every + 1 queued steps (ReadBehind) and fetch-ahead + 1 batches in the
    # fetching thread; one more for margin. Evaluation reads each step's result before the next batch.
    hold = args.read_loss_every + args.fetch_ahead + 3
    train_loader = create_classification_loader(train_src, train=True, auto_augment=auto_augment,
                                                handover=args.handover, hold_batches=hold, **common)
    val_loader = create_classification_loader(val_src, train=False, handover=args.handover, **common)
    num_classes = resolve_num_classes(args.num_classes, train_src.num_classes, data_format=train_src.format, data=data)
    names = label_names(train_src, num_classes=num_classes, sample=args.data is None)
    return train_loader, val_loader, num_classes, names


def main(args: argparse.Namespace) -> dict[str, float]:
    # CUDA's hardware queues stay as the user set them (8 by default): unlike the PyTorch and JAX scripts, this
    # one does not raise them to 32, which made Keras train slower beside DALI (docs/benchmarks.md#tensorflow-keras)
    queues = os.environ.get(CUDA_QUEUES_VARIABLE)
    runtime = init_distributed(engine=args.engine)  # first: it sets up the GPU (memory growth) before TF uses it
    logging.basicConfig(level=logging.INFO if runtime.dist.is_main else logging.WARNING,
                        format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    for noisy in ("tensorflow", "absl"):  # their INFO lines per epoch are noise
        logging.getLogger(noisy).setLevel(logging.WARNING)
    tf.keras.utils.set_random_seed(args.seed)
    gpus = tf.config.list_physical_devices("GPU")
    backend = resolve_backend(args.data_backend, gpu=gpus[0].name if gpus else None,
                              cpu_note="no GPU visible to TensorFlow: DALI runs all operators on the CPU",
                              no_gpu="a GPU visible to TensorFlow (tensorflow-cpu is installed, or CUDA is not set up)")
    on_gpu = bool(tf.config.list_physical_devices("GPU"))
    defaults = resolve_defaults(args, cuda=on_gpu, world_size=runtime.dist.world_size, layout="NHWC")
    if args.amp:
        tf.keras.mixed_precision.set_global_policy("mixed_float16" if on_gpu else "mixed_bfloat16")
    log_accepted_flags(args, channels_last="Keras models here are NHWC already",
                       checkpoint_every="the TensorFlow script saves at epoch ends only (DALIDataset cannot restore a "
                                        "mid-epoch DALI position); a run killed mid-epoch redoes that epoch")
    log.info("rank %d/%d (launcher %s, engine %s), %s", runtime.dist.rank, runtime.dist.world_size,
             runtime.dist.launcher, runtime.engine, "GPU" if on_gpu else "CPU")
    train_loader, val_loader, num_classes, class_names = load_data(args, runtime, backend)
    args.num_classes = num_classes  # the saved config then holds what it was resolved to

    with runtime.scope():  # tf.distribute: variables mirrored (and synchronised from worker 0)
        model = create_model(args.arch, num_classes=num_classes, crop_size=args.crop_size)
    base_lr = defaults.lr
    steps_per_epoch = max(1, train_loader.steps_per_epoch)
    total = args.epochs * steps_per_epoch
    warmup = min(int(args.lr_warmup_epochs * steps_per_epoch), total - 1)

    def schedule(step: int) -> float:
        return lr_at(step, base_lr=base_lr, warmup=warmup, total=total)

    with runtime.scope():
        optimizer = tf.keras.optimizers.SGD(learning_rate=schedule(0), momentum=args.momentum,
                                            weight_decay=args.weight_decay or None)
        if args.amp and on_gpu:
            optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)
    if args.multi_label:  # one sigmoid per class, the mean over every element (PyTorch's BCEWithLogitsLoss)
        loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True)
        if args.label_smoothing:
            log.warning("--label-smoothing %s: not applied with --multi-label (binary targets)", args.label_smoothing)
    else:
        loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True) \
            if not args.label_smoothing else _smoothed_loss(num_classes, args.label_smoothing)

    epoch_var = tf.Variable(0, dtype=tf.int64, trainable=False)
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=epoch_var)
    start_epoch = 0
    if args.resume is not None:
        path = tf.train.latest_checkpoint(str(args.resume)) if args.resume.is_dir() else str(args.resume)
        if path is None or not tf.io.gfile.exists(path + ".index"):
            raise FileNotFoundError(f"--resume {args.resume}: no TensorFlow checkpoint there (expected a folder "
                                    "written by --output-dir, or a prefix such as DIR/ckpt-3)")
        ckpt.restore(path).assert_existing_objects_matched()
        start_epoch = int(epoch_var.numpy())
        train_loader.load_state_dict({"epoch": start_epoch})  # epoch-level: see docs/tensorflow.md
        log.info("resumed from %s at epoch %d", path, start_epoch + 1)
    if runtime.hvd is not None:  # every rank starts from rank 0's weights (fresh or resumed)
        # one by one: hvd.broadcast_variables calls tf.Variable.assign on Keras 3 variables'
        # tensor values and fails ("'SymbolicTensor' object has no attribute 'assign'")
        for var in [*model.variables, *optimizer.variables]:
            var.assign(runtime.hvd.broadcast(tf.convert_to_tensor(var), root_rank=0))
    run_dir = choose_run_dir(args.output_dir, resume=args.resume, task="classification", framework="tensorflow",
                             arch=args.arch)
    manager = None
    if runtime.dist.is_main or runtime.strategy is not None:
        # tf.distribute: every worker takes part in saving (reads may be collective); only
        # worker 0 keeps its files
        where = run_dir if runtime.dist.is_main else run_dir / f".worker-{runtime.dist.rank}"
        manager = tf.train.CheckpointManager(ckpt, str(where), max_to_keep=2)
    metric = "val_map" if args.multi_label else "val_top1"
    best = BestCheckpoint(run_dir, enabled=runtime.dist.is_main, metric=metric, meta={
        "framework": "tensorflow", "arch": args.arch, "num_classes": num_classes, "class_names": class_names,
        "config": args})
    best.resume(start_epoch)

    metrics = open_metrics(run_dir, continuing=args.resume is not None, enabled=runtime.dist.is_main)
    log.info("outputs: %s", run_dir)
    jit_compile = resolve_jit_compile(args.jit_compile, on_gpu=on_gpu, runtime=runtime)
    log.info("train step: %s", "XLA (--jit-compile; the first step of each batch shape compiles it, minutes "
             "for ResNet-50)" if jit_compile else "tf.function without XLA (--jit-compile)")
    metrics.write(event="start", task="classification", framework="tensorflow", arch=args.arch, backend=backend,
                  world_size=runtime.dist.world_size, engine=runtime.engine, batch_size=args.batch_size, lr=base_lr,
                  epochs=args.epochs, jit_compile=jit_compile, cuda_queues=queues if on_gpu else None,
                  read_loss_every=args.read_loss_every, handover=getattr(train_loader, "handover", None),
                  **defaults.record())
    def validate(eval_step) -> dict[str, float]:
        if args.multi_label:
            return evaluate_multilabel(eval_step, val_loader, runtime=runtime)
        return evaluate(eval_step, val_loader, runtime=runtime, num_classes=num_classes)

    make_eval = make_multilabel_eval_step if args.multi_label else make_eval_step
    if args.test_only:
        stats = validate(make_eval(model))
        log.info(format_test_line(stats))
        metrics.write(event="test", **stats)
        return stats

    train_step = make_train_step(model, optimizer, loss_fn, runtime, jit_compile=jit_compile)
    eval_step = make_eval(model)
    stats: dict[str, float] = {}
    for epoch in range(start_epoch, args.epochs):
        steps = StepLog(metrics, epoch=epoch, epochs=args.epochs, total=steps_per_epoch,
                        world_size=runtime.dist.world_size, enabled=runtime.dist.is_main, print_freq=args.print_freq)
        stats = train_one_epoch(train_step, optimizer, train_loader, step0=epoch * steps_per_epoch,
                                schedule=schedule, runtime=runtime, steps=steps,
                                fetch_ahead_batches=args.fetch_ahead, read_loss_every=args.read_loss_every)
        if runtime.hvd is not None:  # Horovod averages gradients only: every rank evaluates (and rank 0
            for var in model.non_trainable_variables:  # saves) rank 0's BatchNorm statistics
                var.assign(runtime.hvd.broadcast(tf.convert_to_tensor(var), root_rank=0))
        stats |= validate(eval_step)
        if not math.isfinite(stats["train_loss"]):
            raise FloatingPointError(f"training loss is {stats['train_loss']} at epoch {epoch + 1}: lower --lr")
        is_best = best.update(epoch + 1, stats)
        log.info(epoch_line(epoch, args.epochs, stats) + ("  (best)" if is_best else ""))
        metrics.write(event="epoch", epoch=epoch + 1, lr=schedule((epoch + 1) * steps_per_epoch - 1), **stats)
        epoch_var.assign(epoch + 1)
        if manager is not None:
            try:
                prefix = Path(manager.save(checkpoint_number=epoch + 1))
            except tf.errors.OpError as e:  # a full disk, a file-size limit: one line, the previous ckpt-N kept
                shutil.rmtree(Path(manager.directory) / f"ckpt-{epoch + 1}_temp", ignore_errors=True)
                raise WriteError(f"cannot write checkpoint ckpt-{epoch + 1} in {manager.directory}: "
                                 f"{e.message.rsplit('; ', 1)[-1].split(' [Op:')[0]}") from None
            if runtime.dist.is_main:  # what the last checkpoint is: class names, arch, config, its epoch
                write_json(run_dir / "checkpoint.json", checkpoint_meta(**best.meta, epoch=epoch + 1, stats=stats,
                                                                        metric=metric, files=[prefix.name]))
            if not runtime.dist.is_main:
                shutil.rmtree(manager.directory, ignore_errors=True)
            elif is_best:  # a copy of ckpt-N's files, the index last
                files = sorted(prefix.parent.glob(f"{prefix.name}.data-*")) + [prefix.with_name(f"{prefix.name}.index")]
                best.save({p.name[len(prefix.name):]: p for p in files}, epoch=epoch + 1, stats=stats)
    if runtime.dist.is_distributed:
        stats["replicas_in_sync"] = replicas_in_sync(model, runtime)
        metrics.write(event="end", replicas_in_sync=stats["replicas_in_sync"])
        if not stats["replicas_in_sync"]:
            log.warning("the workers' weights differ after training: gradients were not averaged")
    if runtime.dist.is_main:
        finish_run(run_dir, metrics=metrics, metric=metric)
    metrics.close()
    return stats


def replicas_in_sync(model, runtime: Runtime) -> bool:
    """True if every worker holds the same weights (checksums equal: their variance is ~0)."""
    digest = float(sum(float(tf.reduce_sum(tf.cast(v, tf.float64))) for v in model.trainable_variables))
    n = runtime.dist.world_size
    total, squares = runtime.all_reduce_sum([digest, digest * digest])
    spread = max(0.0, squares / n - (total / n) ** 2) ** 0.5
    return spread <= 1e-5 * max(1.0, abs(total / n))


def _smoothed_loss(num_classes: int, smoothing: float):
    cce = tf.keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=smoothing)

    def loss(labels, logits):
        return cce(tf.one_hot(labels, num_classes), logits)

    return loss


if __name__ == "__main__":
    run(main, get_args_parser())
