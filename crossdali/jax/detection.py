"""``create_detection_loader``: SSD300 batches as ``jax.Array`` from the shared DALI detection pipeline.

train batches: ``(images (N, 3, 300, 300) float, offsets (N, 8732, 4) float, labels (N, 8732) int)``
               -- DALI's ``box_encoder`` output (regression targets and anchor labels, 0 = background).
val batches:   ``(images, boxes (N, M, 4) ltrb relative, labels (N, M) int with 0 = padding,
               image_ids (N,) int)`` -- for COCO evaluation; M is the longest box list of the batch.

Backends: ``dali-gpu`` and ``dali-cpu`` (the pipeline's layout is CHW: SSD's DALI graph is shared
with the PyTorch SSD example; transpose with ``jnp.transpose(x, (0, 2, 3, 1))`` for flax). There
is no native JAX baseline (see ``crossdali.jax.loaders``), and no JAX SSD model here.
"""

from __future__ import annotations

from pathlib import Path

from crossdali.common.detection import (
    READER_NAME,
    TRAIN_OUTPUTS,
    VAL_OUTPUTS,
    DetectionSource,
    DetectionTransform,
    create_detection_pipeline,
    default_detection_pipelines,
    explain_detection_failure,
    resolve_detection_source,
)
from crossdali.common.distributed import DistInfo
from crossdali.common.loading.loaders import prepare_split
from crossdali.jax.loaders import DALILoader, _no_native, require_gpu

__all__ = ["DETECTION_BACKENDS", "create_detection_loader"]

DETECTION_BACKENDS = ("dali-gpu", "dali-cpu")


def create_detection_loader(
    data: str | Path | DetectionSource,
    *,
    train: bool,
    backend: str = "dali-cpu",
    batch_size: int = 32,
    workers: int = 4,
    seed: int = 0,
    dist: DistInfo | None = None,
    device_id: int | None = None,
    hw_decoder_load: float = 1.0,
    transform: DetectionTransform | None = None,
    last_batch: str | None = None,
    checkpointing: bool = True,
    pipelines: int | None = None,
) -> DALILoader:
    """An iterable of SSD300 train or val batches (see the module docstring) over a COCO-format folder.

    Same arguments as ``crossdali.pytorch.create_detection_loader`` (less ``debug``). The result
    implements ``crossdali.common.loading.loaders.Loader``.

    Args:
        data: a COCO-format folder (``annotations/instances_{train,val}.json`` and ``{train,val}/``) or a
            resolved ``DetectionSource``.
        train: the train split (shuffled, augmented) or the val split (every sample once across shards).
        backend: ``dali-gpu`` or ``dali-cpu``, and where this factory offers them ``native`` or ``synthetic``
            (the module's ``*BACKENDS``).
        batch_size: samples per batch on this rank.
        workers: DALI's threads.
        seed: shuffle and augmentation seed: the same seed gives the same batches.
        dist: rank and world size to shard by (default: one process).
        device_id: the GPU of ``dali-gpu`` (default: the local rank).
        hw_decoder_load: share of the JPEGs sent to the GPU's hardware JPEG decoder, where it has one.
        transform: the augmentation ranges (default: the pipeline's own preset).
        last_batch: the epoch rule's last batch overridden: ``partial`` or ``drop``.
        checkpointing: let ``state_dict()`` hold DALI's position inside an epoch (mid-epoch resume).
        pipelines: DALI pipelines in this process, each reading its own part of the shard, merged into
            each batch; default 2 for training on ``dali-gpu`` where the batch splits evenly, else 1
            (``crossdali.pytorch.create_detection_loader`` says more).
    """
    _no_native(backend)
    if pipelines is None:
        pipelines = default_detection_pipelines(backend, batch_size, train=train)
    plan = prepare_split(data, train=train, backend=backend, backends=DETECTION_BACKENDS,
                         source_type=DetectionSource, resolve=resolve_detection_source, batch_size=batch_size,
                         dist=dist, last_batch=last_batch, what="detection", pipelines=pipelines)
    source = plan.source
    transform = transform or DetectionTransform()
    require_gpu(backend)
    options = plan.pipeline_options(workers=workers, seed=seed, device_id=device_id, hw_decoder_load=hw_decoder_load,
                                    checkpointing=checkpointing)
    return DALILoader(plan, options,
                      lambda opts: create_detection_pipeline(source, train=train, options=opts, transform=transform),
                      names=TRAIN_OUTPUTS if train else VAL_OUTPUTS, reader_name=READER_NAME, flatten=("image_ids",),
                      explain=lambda e: explain_detection_failure(source, e))
