"""``create_multilabel_loader``: (images, multi-hot labels) torch batches from a multi-label list.

The list is read by ``crossdali.common.multilabel`` and fed through the external-source loader
(``crossdali.pytorch.external``): DALI's Python workers read the files, DALI decodes and runs the
shared train or val transform, labels come out as ``(N, classes)`` float32 multi-hot.
"""

from __future__ import annotations

from pathlib import Path

from crossdali.common.distributed import DistInfo
from crossdali.common.multilabel import MultiLabelSource, multilabel_loader_args, resolve_multilabel_source
from crossdali.pytorch.external import ExternalSourceLoader, create_external_source_loader

__all__ = ["create_multilabel_loader", "resolve_multilabel_source"]


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
    checkpointing: bool = True,
    exclude=None,
    channels_last: bool = False,
) -> ExternalSourceLoader:
    """PyTorch ``(images, labels)`` batches of the train or val split of a multi-label list: float
    NCHW images (crossdali's train or val transform) and ``(N, classes)`` float32 multi-hot labels.
    Every sample once per epoch across the shards, reshuffled every training epoch.

    Args:
        data: a folder with ``train.txt``/``val.txt`` (or ``.csv``), a list file, or a resolved
            ``MultiLabelSource``.
        train: the train split (shuffled, augmented) or val.
        backend: ``dali-gpu`` or ``dali-cpu``.
        batch_size: samples per batch on this rank.
        crop_size: side of the square output images.
        workers: DALI's threads.
        py_workers: DALI's Python worker processes reading the files (0: read in this process).
        seed: shuffle and augmentation seed.
        dist: rank and world size to shard by (default: one process).
        device_id: the GPU of ``dali-gpu`` (default: the local rank).
        dtype: ``float32`` or ``float16`` images.
        checkpointing: let ``state_dict()`` resume mid-epoch.
        exclude: an exclusion list (``crossdali check`` writes one) or sample ids to leave out.
        channels_last: the images in torch's channels-last memory format
            (``create_classification_loader``).
    """
    source, kwargs = multilabel_loader_args(data, train=train, py_workers=py_workers, exclude=exclude)
    return create_external_source_loader(
        source, train=train, backend=backend, batch_size=batch_size, crop_size=crop_size, workers=workers,
        seed=seed, dist=dist, device_id=device_id, dtype=dtype, checkpointing=checkpointing,
        channels_last=channels_last, **kwargs)
