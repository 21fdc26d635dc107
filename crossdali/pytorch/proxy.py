"""DALI Proxy with crossdali's transform: keep your own ``Dataset`` and ``DataLoader``, and let one
DALI pipeline decode and augment the batches they produce.

DALI Proxy (``nvidia.dali.plugin.pytorch.experimental.proxy``) is the middle step between a plain
``DataLoader`` and a full DALI pipeline (docs/from-dataloader.md): the ``Dataset`` still reads each
sample (file, database, object store) in the ``DataLoader``'s worker processes, but instead of
decoding it, it hands the encoded bytes to a proxy callable and returns a reference. The
``DataLoader`` batches the references as usual; a ``DALIServer`` in the main process feeds each
worker's batch to one DALI pipeline (on the GPU with ``backend="dali-gpu"``: one CUDA context, the
hardware JPEG decoder) and puts the pipeline's outputs where the references were. Labels and any
other fields of the sample stay in PyTorch's hands.

    server = create_proxy_server(train=True, backend="dali-gpu", batch_size=256)
    with server:   # the server's thread runs while the block does
        loader = create_proxy_loader(server, my_dataset, batch_size=256, shuffle=True, num_workers=8)
        for images, labels in loader:   # images: float NCHW on cuda:0, labels: as my_dataset gives them
            ...

The pipeline is ``fn.external_source`` followed by ``crossdali.common.classification.augment_classification``,
the same train or val transform as every crossdali loader, so a proxy-fed val batch equals
``create_classification_loader``'s batch of the same files bit for bit (tests/pytorch/test_proxy.py).
Works with ``backend="dali-cpu"`` too (no GPU needed).

What the ``DataLoader`` keeps deciding: the order (its sampler: shuffle per epoch, a
``DistributedSampler`` for several ranks), the batching and the last partial batch. What DALI
decides: the decode, the random crop and flip (seeded by ``seed``; the batches reach DALI in the
order workers finish them unless ``deterministic=True``) and the normalisation.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from nvidia.dali.plugin.pytorch.experimental import proxy as dali_proxy

from crossdali.common.classification import ClassificationTransform, augment_classification
from crossdali.common.data.sources import sniff_image_bytes
from crossdali.common.distributed import DistInfo
from crossdali.common.errors import DataError
from crossdali.common.options import pipeline_options
from crossdali.pytorch.loaders import require_cuda

__all__ = ["PROXY_BACKENDS", "IMAGES_INPUT", "create_proxy_pipeline", "create_proxy_server", "ProxyDataset",
           "ProxyLoader", "create_proxy_loader"]

PROXY_BACKENDS = ("dali-gpu", "dali-cpu")
#: the pipeline's one input: the name of its ``fn.external_source`` and of the proxy callable's argument
IMAGES_INPUT = "images"


def create_proxy_pipeline(*, train: bool, backend: str = "dali-gpu", batch_size: int = 256, crop_size: int = 224,
                          workers: int = 4, seed: int = 0, dist: DistInfo | None = None, device_id: int | None = None,
                          dtype: str = "float32", hw_decoder_load: float = 1.0, prefetch_queue_depth: int = 2):
    """The DALI pipeline a proxy server runs: encoded images in (``IMAGES_INPUT``), crossdali's train
    or val transform, images out (float CHW). Built, not started.

    Args:
        train: random-resized crop + flip + normalize, or resize + centre crop + normalize.
        backend: ``dali-gpu`` (mixed decoder, outputs on ``cuda:<device_id>``) or ``dali-cpu``.
        batch_size: the largest batch the ``DataLoader`` hands it.
        crop_size: side of the square output images.
        workers: DALI's CPU threads.
        seed: the augmentation's random seed (each rank of ``dist`` derives its own from it).
        dist: rank and world size (default: one process). The GPU is the local rank's and every
            rank augments differently; splitting the data is the ``DataLoader``'s sampler's job
            (e.g. ``DistributedSampler``).
        device_id: the GPU of ``dali-gpu`` (default: the local rank's).
        dtype: ``float32`` or ``float16`` images.
        hw_decoder_load: the share of JPEGs for the GPU's hardware JPEG decoder (``dali-gpu``).
        prefetch_queue_depth: batches DALI holds in flight; the server feeds it up to this many
            of the batches the workers have finished.
    """
    from nvidia.dali import fn, pipeline_def, types

    options = pipeline_options(backend, batch_size=batch_size, dist=dist, device_id=device_id, workers=workers, seed=seed,
                               hw_decoder_load=hw_decoder_load, checkpointing=False,
                               prefetch_queue_depth=prefetch_queue_depth)
    transform = ClassificationTransform(crop_size=crop_size, dtype=dtype)

    @pipeline_def(**options.pipeline_kwargs())
    def proxy_pipeline():
        # copied on feed_input (no_copy=False): the server's thread drops its reference to a batch's
        # bytes while DALI may still be reading them, and the bytes are small beside the images
        jpegs = fn.external_source(name=IMAGES_INPUT, dtype=types.UINT8, ndim=1, no_copy=False)
        return augment_classification(jpegs, train=train, options=options, transform=transform)

    return proxy_pipeline()


def create_proxy_server(*, train: bool, backend: str = "dali-gpu", batch_size: int = 256, crop_size: int = 224,
                        workers: int = 4, seed: int = 0, dist: DistInfo | None = None, device_id: int | None = None,
                        dtype: str = "float32", hw_decoder_load: float = 1.0, prefetch_queue_depth: int = 2,
                        deterministic: bool = False):
    """A ``DALIServer`` (``nvidia.dali.plugin.pytorch.experimental.proxy``) over
    :func:`create_proxy_pipeline`. Use it as a context manager (its thread runs inside the block)
    and give it to :func:`create_proxy_loader` with your ``Dataset``.

    Args:
        train, backend, batch_size, crop_size, workers, seed, dist, device_id, dtype, hw_decoder_load:
            as :func:`create_proxy_pipeline`.
        prefetch_queue_depth: batches DALI holds in flight (default 2; DALI's own example uses
            twice the ``DataLoader``'s workers).
        deterministic: run the batches in the order the training loop takes them, so that the
            random crops and flips repeat from run to run with a seeded sampler. Slower: DALI
            starts a batch only when the loop asks for it, not when a worker finishes it.
    """
    if backend not in PROXY_BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(PROXY_BACKENDS)}; got {backend!r}")
    require_cuda(backend)
    pipe = create_proxy_pipeline(train=train, backend=backend, batch_size=batch_size, crop_size=crop_size,
                                 workers=workers, seed=seed, dist=dist, device_id=device_id, dtype=dtype,
                                 hw_decoder_load=hw_decoder_load, prefetch_queue_depth=prefetch_queue_depth)
    return dali_proxy.DALIServer(pipe, deterministic=deterministic)


def _encoded(value: Any, index: int) -> np.ndarray:
    """``value`` (a sample's encoded image) as the 1-D uint8 array DALI's external source takes."""
    if isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.ndim == 1:
        data = value
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data = np.frombuffer(value, dtype=np.uint8)
    elif isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 1:
        data = value.numpy()
    else:
        what = f"{value.dtype} array of shape {tuple(value.shape)}" if hasattr(value, "shape") else type(value).__name__
        raise DataError(f"sample {index}: the image is a {what}; the dataset must give the encoded file's bytes "
                        "(bytes, a 1-D uint8 numpy array or tensor) for DALI to decode, not decoded pixels")
    problem = sniff_image_bytes(data[:16].tobytes())
    if problem is not None:
        raise DataError(f"sample {index} is {problem}; DALI decodes JPEG, PNG, BMP, TIFF, JPEG 2000, WebP and PNM: "
                        "re-encode it or leave it out of the dataset")
    return data


class ProxyDataset(torch.utils.data.Dataset):
    """Your ``Dataset`` of ``(encoded image, label, ...)`` samples (or of bare encoded images), with
    the encoded image replaced by the server's reference to its decoded, augmented version; the
    other fields pass through untouched. Runs in the ``DataLoader``'s workers.

    Args:
        dataset: any map-style dataset (``len`` and ``[i]``) whose sample's first field is the
            file's bytes (``bytes``, ``bytearray``, ``memoryview``, 1-D uint8 numpy array or tensor).
        server: a ``DALIServer`` from :func:`create_proxy_server`.
    """

    def __init__(self, dataset, server) -> None:
        self.dataset = dataset
        self.proxy: Callable = server.proxy
        # Which iterator the workers serve (ProxyLoader counts them): part of every batch's id, so
        # that the batches of an epoch left early are never mistaken for the next epoch's.
        self.generation = 0

    def _worker_key(self) -> tuple[int, int]:
        info = torch.utils.data.get_worker_info()
        return self.generation, info.id if info is not None else threading.get_ident()

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        # in this worker's copy of the proxy (forked): name its batches by generation and worker
        self.proxy._get_worker_id = self._worker_key
        sample = self.dataset[index]
        if isinstance(sample, (tuple, list)):
            if not sample:
                raise DataError(f"sample {index} is empty; the dataset must give (encoded image bytes, label, ...)")
            return (self.proxy(_encoded(sample[0], index)), *sample[1:])
        return self.proxy(_encoded(sample, index))


def _batch_id(raw) -> tuple | None:
    """The server's id of a collated batch (``((generation, worker), batch index)``), before its images are produced."""
    ref = raw[0] if isinstance(raw, (list, tuple)) and raw else raw
    return ref.pipe_run_ref.batch_id if isinstance(ref, dali_proxy.DALIOutputBatchRef) else None


class ProxyLoader(dali_proxy.DataLoader):
    """DALI's proxy ``DataLoader`` that survives an epoch left early (:func:`create_proxy_loader` makes one).

    DALI's own loader names a batch by (worker, batch index). The workers of a new epoch start
    counting again, while the batches that the old workers had handed to DALI before a ``break``
    still come out of the server: the new epoch then got the old epoch's images beside its own
    labels, silently (tests/pytorch/test_proxy.py shows it). Here every iterator has its own
    generation in the batch ids, and outputs that no iterator will ask for again (an older
    generation's, or a worker's batches before the one just delivered) are dropped instead of
    kept in the server's cache.
    """

    class _Iter(dali_proxy.DataLoader._Iter):
        def _next_data(self):
            self.loader.ensure_server_listening()
            raw = super(dali_proxy.DataLoader._Iter, self)._next_data()  # torch's batch, images still references
            delivered = _batch_id(raw)
            batch = self.loader.dali_server.produce_data(raw)
            if delivered is not None:
                self.loader._forget_before(delivered)
            return batch

    def _get_iterator(self):
        self.dataset.generation += 1  # before the workers fork: they inherit it
        return ProxyLoader._Iter(self)

    def _forget_before(self, delivered: tuple) -> None:
        (generation, worker), index = delivered
        cache = self.dali_server._cache_outputs
        for key in [k for k in cache if k[0][0] != generation or (k[0][1] == worker and k[1] < index)]:
            del cache[key]


def create_proxy_loader(server, dataset, *, batch_size: int, num_workers: int, **dataloader_kwargs):
    """A ``torch.utils.data.DataLoader`` (DALI's proxy ``DataLoader``) over ``ProxyDataset(dataset, server)``:
    batches come out with the images produced by the server's pipeline.

    Args:
        server: the ``DALIServer`` of :func:`create_proxy_server`; its pipeline's batch size is the
            largest ``batch_size`` it accepts.
        dataset: your map-style dataset of ``(encoded image bytes, label, ...)``.
        batch_size: samples per batch (at most the server's).
        num_workers: the ``DataLoader``'s worker processes, at least 1 (the proxy collects each
            worker's batch; DALI's proxy ``DataLoader`` has no single-process mode).
        dataloader_kwargs: anything else ``torch.utils.data.DataLoader`` takes (``shuffle``,
            ``sampler``, ``drop_last``, ``persistent_workers``, ...), except ``collate_fn`` (the
            proxy needs the default collate, which knows its references) and a start method other
            than ``fork`` (the server's proxy cannot be pickled for spawned workers).
    """
    limit = server._pipe.max_batch_size
    if batch_size > limit:
        raise ValueError(f"batch_size={batch_size} is larger than the proxy server's pipeline batch ({limit}); "
                         f"pass batch_size={batch_size} to create_proxy_server too")
    if num_workers < 1:
        raise ValueError("DALI Proxy needs num_workers >= 1: the proxy collects each worker's batch for DALI")
    if dataloader_kwargs.get("collate_fn") is not None:
        raise ValueError("DALI Proxy needs the DataLoader's default collate (it knows the proxy's references); "
                         "drop collate_fn and collate the other fields after the loader")
    context = dataloader_kwargs.pop("multiprocessing_context", None) or "fork"
    method = context if isinstance(context, str) else context.get_start_method()
    if method != "fork":
        raise ValueError(f"DALI Proxy needs forked DataLoader workers, not {method!r}: its proxy cannot be pickled")
    return ProxyLoader(server, ProxyDataset(dataset, server), batch_size=batch_size, num_workers=num_workers,
                       multiprocessing_context=context, **dataloader_kwargs)
