"""``create_multilabel_loader``: (images, multi-hot labels) ``jax.Array`` batches from a multi-label
list: ``crossdali.common.multilabel`` reads it, the external-source loader
(``crossdali.jax.external``) feeds it to DALI's shared train or val transform.
"""

from __future__ import annotations

from pathlib import Path

from crossdali.common.distributed import DistInfo
from crossdali.common.multilabel import MultiLabelSource, multilabel_loader_args
from crossdali.jax.external import ExternalSourceLoader, create_external_source_loader

__all__ = ["create_multilabel_loader"]


def create_multilabel_loader(
    data: str | Path | MultiLabelSource,
    *,
    train: bool,
    backend: str = "dali-cpu",
    batch_size: int = 256,
    crop_size: int = 224,
    workers: int = 4,
    py_workers: int = 2,
    seed: int = 0,
    dist: DistInfo | None = None,
    device_id: int | None = None,
    dtype: str = "float32",
    layout: str = "HWC",
    checkpointing: bool = True,
    exclude=None,
) -> ExternalSourceLoader:
    """``(images, labels)`` for the train or val split of a multi-label list: float NHWC images
    (``layout="CHW"`` for NCHW) and ``(N, classes)`` float32 multi-hot labels; the arguments of
    ``crossdali.pytorch.create_multilabel_loader``.

    Args:
        data: a folder with ``train.txt``/``val.txt`` (or ``.csv``), a list file, or a resolved
            ``MultiLabelSource``.
        train: the train split (shuffled, augmented) or the val split (every sample once across shards).
        backend: ``dali-gpu`` or ``dali-cpu``, and where this factory offers them ``native`` or ``synthetic``
            (the module's ``*BACKENDS``).
        batch_size: samples per batch on this rank.
        crop_size: side of the square output images.
        workers: DALI's threads.
        py_workers: DALI's Python worker processes reading the files (0: read in this process).
        seed: shuffle and augmentation seed: the same seed gives the same batches.
        dist: rank and world size to shard by (default: one process).
        device_id: the GPU of ``dali-gpu`` (default: the local rank).
        dtype: ``float32`` or ``float16`` outputs.
        layout: ``HWC`` or ``CHW`` images.
        checkpointing: let ``state_dict()`` hold DALI's position inside an epoch (mid-epoch resume).
        exclude: an exclusion list (``crossdali check`` writes one) or sample ids to leave out.
    """
    source, kwargs = multilabel_loader_args(data, train=train, py_workers=py_workers, exclude=exclude)
    return create_external_source_loader(
        source, train=train, backend=backend, batch_size=batch_size, crop_size=crop_size, workers=workers,
        seed=seed, dist=dist, device_id=device_id, dtype=dtype, layout=layout, checkpointing=checkpointing, **kwargs)
