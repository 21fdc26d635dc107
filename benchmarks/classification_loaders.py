"""Images/s and data-wait of every PyTorch data backend on the same JPEGs (RN50 train transform;
docs/benchmarks.md#classification-loaders).

    python -m benchmarks.classification_loaders                           # on a GPU machine: results/latest
    python -m benchmarks.plot results/latest/classification_loaders.json  # redraw its PNG from the JSON

Two measurements, both on the ``bench`` sample set (8,195 train JPEGs cut from real photos):

- loader: the bare input pipeline, batches consumed as float NCHW tensors on the GPU. One epoch
  warms up (workers, caches, allocator); then whole epochs are timed until at least 2 epochs and
  ``--min-seconds`` (5 s) have passed.
- train: a training step (--arch, default ResNet-50; AMP on the GPU, channels-last) fed by the backend; images/s,
  the share of the step spent waiting for data and that wait per step (median, p90, max, every step's).
  ``synthetic`` is the upper bound. Each row runs twice (``--train-sync``): without and with a device
  sync after every batch fetch (as a loop reading ``loss.item()`` every step does), which shows what
  the per-step sync costs each backend; ``--train-loop`` picks how the step meets the host (plain SGD,
  whose GradScaler waits for the device every step; fused SGD, with which the host runs ahead; fused
  SGD with the next batch fetched before the loss is read; fused SGD with each loss read one, two or
  three steps late; fused SGD with each loss copied at its step, as crossdali's trainer does);
  ``--train-profile-steps`` adds the GPU time per step of the model's stream and of DALI's from torch.profiler.

Configurations: torchvision ImageFolder + PIL, torchvision decode_image + v2 (crossdali's
``native``), torchvision's batched ``decode_jpeg`` on the GPU + the same v2 preset there, SPDL
(Meta's thread-based loader, ``spdl-io``; optional: its rows say ``skipped`` where it does not
import) three ways: FFmpeg decode in threads + the v2 preset there, FFmpeg decode with the crop,
resize and flip done by FFmpeg's filter graph (SPDL's documented augmentation) + v2 normalize on
the device, and SPDL's nvJPEG GPU decode + v2 on the GPU (CUDA only); DALI all-CPU, and DALI mixed
with the hardware JPEG decoder share 0 / 0.5 / 0.75 / 1.0 and 2 / 4 / 8 / 15 CPU threads; DALI CPU
and GPU with the shard split over 2 and 3 pipelines (``pipelines=``, the same threads in all).

Engine load: every loader and train row carries ``engine_load``, the mean (and max) percent of the
GPU's SMs, NVDEC, NVJPG, ... from ``nvidia-smi dmon`` over the row's timed epochs (train rows: over
the warm-up and timed steps); ``None`` without nvidia-smi. The raw dmon lines go to
``dmon_classification.log``. Writes ``classification_loaders.json`` (default folder ``results/latest``),
rewritten after every configuration, so a run cut short keeps what it measured, and at the end its PNG.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import math
import os
import random
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import torch

from benchmarks import round_spread, usage_error
from benchmarks.engine_load import EngineLoad
from benchmarks.loader_rows import environment, sync, time_epochs, write_report
from benchmarks.plot import plot_classification
from crossdali.common.data.sample_data import ensure_classification
from crossdali.common.data.sources import resolve_source
from crossdali.common.loading.cuda_queues import QUEUES, share_gpu_with_dali
from crossdali.pytorch import create_classification_loader
from crossdali.pytorch.training import copy_to_host, create_optimizer


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, add_help=add_help, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results/latest"), help="folder for the JSON")
    parser.add_argument("--data-root", type=Path, default=None, help="where to build the bench sample set")
    parser.add_argument("--size", default="bench", help="sample set size (bench: 8,195 JPEGs)")
    parser.add_argument("-b", "--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=15, help="threads / workers for the main comparison")
    parser.add_argument("--threads", default="2,4,8,15", help="thread counts for the dali-gpu sweep")
    parser.add_argument("--hw-loads", default="0,0.5,0.75,1.0", help="hw_decoder_load values for the sweep")
    parser.add_argument("--pipelines", default="2,4",
                        help="DALI pipelines per process (pipelines=), each with --workers / N threads: the "
                             "dali-cpu and dali-gpu (hardware share 1) rows that split the shard")
    parser.add_argument("--pipeline-hw-loads", default="1",
                        help="hw_decoder_load values of the dali-gpu --pipelines rows, comma-separated (one row each): "
                             "below 1, the rest of the JPEGs go to nvJPEG's CUDA decoder (Huffman on the pipeline's CPU "
                             "threads) beside the hardware engines")
    parser.add_argument("--global-order", action="store_true",
                        help="also the DALI rows in the global order (global_order=True: one order per epoch for any "
                             "number of ranks, docs/distributed.md#resuming-on-a-different-number-of-gpus), beside the "
                             "sharded default")
    parser.add_argument("--auto-augment", default="", metavar="POLICIES",
                        help="also the DALI CPU and GPU (hardware share 1) rows with these augmentation policies, "
                             "comma-separated (autoaugment,randaugment,trivialaugment; crossdali.common.augment): what "
                             "each costs beside the plain rows (docs/benchmarks.md#auto-augment)")
    parser.add_argument("--only", action="append", default=[], metavar="SUBSTRING",
                        help="only the loader rows whose name contains SUBSTRING (repeatable), e.g. --only DALI")
    parser.add_argument("--skip-train", action="store_true", help="only the bare loader measurement")
    parser.add_argument("--skip-loader", action="store_true", help="only the training measurement")
    parser.add_argument("--min-seconds", type=float, default=5.0,
                        help="time whole epochs until at least this long (and at least 2 epochs) per loader")
    parser.add_argument("--train-warmup", type=int, default=10, help="untimed ResNet-50 steps before timing")
    parser.add_argument("--train-steps", type=int, default=60, help="timed ResNet-50 steps per backend")
    parser.add_argument("--train-sync", default="none,step",
                        help="per training row: 'none' (the host runs ahead; the loss is never read) and/or 'step' "
                             "(wait for the device after fetching every batch, as a loop reading loss.item() does)")
    parser.add_argument("--train-loop", default="scaler",
                        help="per synthetic and data training row, comma-separated: 'scaler' (plain SGD; GradScaler "
                             "waits for the device every step), 'fused' (fused SGD: the host runs ahead), 'lookahead' "
                             "(fused SGD, the loss read every step, the next batch fetched before that read), 'lagged', "
                             "'lagged2', 'lagged3' (fused SGD, each loss read one, two, three steps late), 'copied', 'copied2' "
                             "(fused SGD, each loss copied to the host at its step, read one or two steps late)")
    parser.add_argument("--train-prefetch", default="2",
                        help="DALI's prefetch_queue_depth for the DALI training rows, comma-separated (one row each)")
    parser.add_argument("--train-profile-steps", type=int, default=0,
                        help="after each training row's timed steps, this many more under torch.profiler: GPU time "
                             "per step by CUDA stream (the model's and DALI's) in the row's gpu_time (CUDA only)")
    parser.add_argument("--train-stream", default="default",
                        help="per synthetic and dali-gpu training row: 'default' (the model on PyTorch's default "
                             "stream) and/or 'high' (on a stream of the highest priority, so DALI's kernels, on "
                             "its own default-priority stream, yield the SMs to the model's)")
    parser.add_argument("--train-last-batch", choices=("drop", "partial"), default="drop",
                        help="the training rows' last-batch policy: 'drop' (default) gives every row the same full "
                             "batches; 'partial' (the loaders' default on one GPU, every image once per epoch) adds "
                             "one short step per epoch to the data rows (3 images on the bench set) that the "
                             "synthetic rows, always full, do not have")
    parser.add_argument("--train-backends", default="synthetic,dali-gpu,dali-cpu,native",
                        help="the backends of the training rows")
    parser.add_argument("--train-rounds", type=int, default=1,
                        help="run the training rows this many times, interleaved (synthetic, dali-gpu, ..., then "
                             "again): the spread between rounds shows what one row's number is worth")
    parser.add_argument("--train-threads", default="4,15",
                        help="DALI threads for the dali-gpu training rows (the other backends use --workers)")
    parser.add_argument("--arch", default="resnet50", help="torchvision model trained in the training rows")
    parser.add_argument("--crop-size", type=int, default=224, help="random-resized-crop size of every row")
    parser.add_argument("--cuda-queues", default=str(QUEUES), metavar="N|unset",
                        help="CUDA_DEVICE_MAX_CONNECTIONS for this process unless the environment sets it (default "
                             f"{QUEUES}, what crossdali's training scripts set; 'unset' leaves CUDA's 8): DALI's streams "
                             "and the model's share these hardware queues (crossdali.common.loading.cuda_queues)")
    parser.add_argument("--smoke", action="store_true",
                        help="check the script on a CPU-only machine: tiny set, CPU backends, 2 steps")
    return parser


def _pil_imagefolder_loader(source, *, batch_size: int, workers: int, crop: int):
    """The loader most PyTorch code runs: torchvision ImageFolder (PIL decode) + v2 preset."""
    from torchvision.datasets import ImageFolder

    from crossdali.common.classification import ClassificationTransform
    from crossdali.pytorch.presets import ClassificationPresetTrain

    preset = ClassificationPresetTrain(transform=ClassificationTransform(crop_size=crop))
    dataset = ImageFolder(str(source.root), transform=preset)
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                                       pin_memory=True, persistent_workers=True, drop_last=False)


class _FileBytes(torch.utils.data.Dataset):
    """(encoded bytes, label) per file: what a DataLoader worker hands a GPU decoder. Plain bytes,
    not tensors: a batch of small tensors from workers goes through one shared file descriptor each,
    and a 2-core run failed with EBADF that way."""

    def __init__(self, files: tuple[str, ...], labels: tuple[int, ...]) -> None:
        self.files, self.labels = files, labels

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        with open(self.files[i], "rb") as f:
            return bytearray(f.read()), self.labels[i]


def _bytes_batch(samples):
    return [data for data, _ in samples], torch.tensor([label for _, label in samples])


class _TorchvisionGPUDecodeLoader:
    """torchvision's batched ``decode_jpeg`` on ``device`` (nvJPEG on a GPU) over file bytes read by
    DataLoader workers, then the same v2 preset per image where the pixels are: the GPU path a
    torchvision user writes without DALI."""

    def __init__(self, source, *, batch_size: int, workers: int, crop: int, device: torch.device) -> None:
        from crossdali.common.classification import ClassificationTransform
        from crossdali.pytorch.presets import ClassificationPresetTrain

        self.device = device
        self.preset = ClassificationPresetTrain(transform=ClassificationTransform(crop_size=crop))
        self.loader = torch.utils.data.DataLoader(_FileBytes(source.files, source.labels), batch_size=batch_size,
                                                  shuffle=True, num_workers=workers, collate_fn=_bytes_batch,
                                                  persistent_workers=workers > 0)

    def __iter__(self):
        from torchvision.io import ImageReadMode, decode_jpeg

        for datas, labels in self.loader:
            encoded = [torch.frombuffer(data, dtype=torch.uint8) for data in datas]
            images = decode_jpeg(encoded, mode=ImageReadMode.RGB, device=self.device)
            yield torch.stack([self.preset(image) for image in images]), labels


SPDL_ROWS = {  # row name -> kind; SPDL is optional, so these rows may say "skipped"
    "SPDL (FFmpeg decode in threads) + v2": "spdl-v2",
    "SPDL (FFmpeg decode + crop/flip filter in threads)": "spdl-filter",
    "SPDL nvJPEG (GPU decode) + v2": "spdl-nvjpeg",
}
SPDL_NVJPEG_CONCURRENCY = 7  # what SPDL's ImageNet example runs its nvJPEG stage with


def _spdl_missing(probe: str) -> str | None:
    """Why SPDL cannot run here, ``None`` when it can. ``spdl.io`` imports without its FFmpeg
    libraries and fails at the first decode, so the probe decodes one real file."""
    try:
        import spdl.io
        import spdl.pipeline  # noqa: F401

        spdl.io.load_image(probe)
    except Exception as e:  # ImportError, or RuntimeError naming the FFmpeg libraries it looked for
        return f"SPDL is not usable here: {type(e).__name__}: {e}"
    return None


def _spdl_version() -> str | None:
    try:
        return metadata.version("spdl_io")
    except metadata.PackageNotFoundError:
        return None


class _SPDLLoader:
    """``spdl.pipeline.PipelineBuilder`` stages over the (path, label) pairs: ``per_sample`` in
    ``threads`` threads, batches of ``batch_size`` through ``per_batch`` (``batch_concurrency`` at
    once), then ``device_stage`` on one dedicated thread (SPDL's advice for the host-to-device copy:
    one thread keeps one CUDA stream). One pipeline for all epochs, its source ``continuous`` and
    reshuffled each pass (SPDL 0.8's multi-epoch reuse, like ``persistent_workers``): rebuilding it
    per epoch put its start-up into every timed epoch. ``max_failures=0``: a file that fails stops
    the row instead of shrinking the epoch unseen."""

    def __init__(self, source, *, per_sample, per_batch, device_stage, batch_size: int, threads: int,
                 batch_concurrency: int = 1) -> None:
        from spdl.pipeline import PipelineBuilder

        device_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spdl-device")
        builder = PipelineBuilder().add_source(_Reshuffled(list(zip(source.files, source.labels, strict=True))),
                                               continuous=True)
        if per_sample is not None:
            builder.pipe(per_sample, concurrency=threads)
        builder.aggregate(batch_size).pipe(per_batch, concurrency=batch_concurrency)
        if device_stage is not None:
            builder.pipe(device_stage, executor=device_thread)
        self.pipeline = builder.add_sink(3).build(num_threads=threads, max_failures=0)
        weakref.finalize(self, _stop_spdl, self.pipeline, device_thread)

    def __iter__(self):
        return self.pipeline.get_iterator()  # one epoch


class _Reshuffled:
    """The samples in a new random order on every pass."""

    def __init__(self, samples: list) -> None:
        self.samples = samples

    def __iter__(self):
        return iter(random.sample(self.samples, len(self.samples)))


def _stop_spdl(pipeline, device_thread: ThreadPoolExecutor) -> None:
    """Stop the pipeline (it runs ahead into the next epoch), then the thread its last stage used."""
    pipeline.stop()
    device_thread.shutdown()


def _spdl_loader(kind: str, source, *, batch_size: int, workers: int, crop: int, device: torch.device):
    """The SPDL rows, written the way SPDL's examples and docs load images (imagenet_classification.py,
    image_dataloading.py, docs io/filtering "Data Augmentation with Filters"), with the RN50 train
    transform of the other rows:

    - ``spdl-v2``: ``spdl.io.load_image`` (FFmpeg decode to RGB24) per file in the pipeline's
      threads, then the v2 preset on that CPU tensor in the same thread; ``transfer_tensor_h2d``.
    - ``spdl-filter``: the random-resized-crop box (torchvision's own draw) and the flip become an
      FFmpeg filter graph (crop, bilinear scale, hflip) run by ``decode_packets``, so the full-size
      image never reaches Python; ``convert_frames`` batches, then h2d and v2's normalize on the device.
      Resampling is swscale's bilinear, not torchvision's antialiased bilinear: same geometry, not
      bit-equal pixels.
    - ``spdl-nvjpeg``: ``decode_image_nvjpeg`` per image (full size, on the GPU), then the v2 preset
      there, per batch, ``SPDL_NVJPEG_CONCURRENCY`` batches at once. Not ``load_image_batch_nvjpeg``:
      it resizes every image to one size first, which would squash it before the random crop.
    """
    import spdl.io
    from torchvision.transforms import RandomResizedCrop
    from torchvision.transforms.v2 import functional as F

    from crossdali.common.classification import ClassificationTransform
    from crossdali.pytorch.presets import ClassificationPresetTrain

    transform = ClassificationTransform(crop_size=crop)
    preset = ClassificationPresetTrain(transform=transform)
    cuda = device.type == "cuda"

    def stack(samples):
        return torch.stack([image for image, _ in samples]), torch.tensor([label for _, label in samples])

    def to_device(batch):
        return spdl.io.transfer_tensor_h2d(batch) if cuda else batch

    if kind == "spdl-v2":
        def decode_v2(sample):
            path, label = sample
            hwc = spdl.io.to_torch(spdl.io.load_image(path))  # uint8 RGB, HWC
            return preset(hwc.permute(2, 0, 1)), label

        return _SPDLLoader(source, per_sample=decode_v2, per_batch=stack, device_stage=to_device,
                           batch_size=batch_size, threads=workers)

    if kind == "spdl-filter":
        mean, std = [m / 255 for m in transform.mean], [s / 255 for s in transform.std]

        def decode_cropped(sample):
            path, label = sample
            packets = spdl.io.demux_image(path)
            # torchvision's draw needs only the size: a tensor of that height and width with no data
            top, left, h, w = RandomResizedCrop.get_params(torch.empty(0, packets.height, packets.width),
                                                           list(transform.random_area),
                                                           list(transform.random_aspect_ratio))
            flip = ",hflip" if random.random() < 0.5 else ""
            graph = f"crop={w}:{h}:{left}:{top},scale={crop}:{crop}:flags=bilinear,format=pix_fmts=rgb24{flip}"
            return spdl.io.decode_packets(packets, filter_desc=graph), label

        def batch_frames(samples):
            buffer = spdl.io.convert_frames([frames for frames, _ in samples])  # uint8 NHWC
            return spdl.io.to_torch(buffer), torch.tensor([label for _, label in samples])

        def normalize_on_device(batch):
            images, labels = to_device(batch)
            images = F.to_dtype(images.permute(0, 3, 1, 2), torch.float32, scale=True)
            return F.normalize(images, mean, std), labels

        return _SPDLLoader(source, per_sample=decode_cropped, per_batch=batch_frames,
                           device_stage=normalize_on_device, batch_size=batch_size, threads=workers)

    if kind == "spdl-nvjpeg":
        cuda_config = spdl.io.cuda_config(device_index=device.index or 0,
                                          allocator=(torch.cuda.caching_allocator_alloc,
                                                     torch.cuda.caching_allocator_delete))

        def decode_batch_nvjpeg(samples):
            images = [preset(spdl.io.to_torch(spdl.io.decode_image_nvjpeg(path, device_config=cuda_config)))
                      for path, _ in samples]  # each uint8 RGB, CHW, on the GPU
            return stack(list(zip(images, (label for _, label in samples), strict=True)))

        return _SPDLLoader(source, per_sample=None, per_batch=decode_batch_nvjpeg, device_stage=None,
                           batch_size=batch_size, threads=workers, batch_concurrency=workers)
    raise ValueError(f"unknown SPDL row kind {kind!r}")


def _error_text(e: Exception) -> str:
    """``Type: message``; for an exception group (SPDL's ``PipelineFailure``: "pipeline stages
    failed") also the root cause of its first failure, which says what went wrong."""
    text = f"{type(e).__name__}: {e}"
    first = next(iter(getattr(e, "exceptions", ())), None)  # getattr: no ExceptionGroup before Python 3.11
    if first is None:
        return text
    cause = first.__cause__ or first
    return f"{text}: {type(cause).__name__}: {cause}"


def _engine_text(load: dict | None) -> str:
    """The console's share of a row's engine load: SMs, NVDEC and NVJPG means, when dmon ran."""
    if not load:
        return ""
    return "".join(f"  {name} {load[name]:.0f} %" for name in ("sm", "dec", "jpg") if name in load)


#: ``--train-loop`` choices: how the training step meets the host (what each costs a data row is the question)
TRAIN_LOOPS = {
    # plain SGD: GradScaler.step reads the found-inf flag on the host every step, so the host waits for
    # the GPU and the next batch is fetched while the GPU idles (torchvision's reference loop)
    "scaler": "",
    # SGD(fused=True): GradScaler hands the flag to the fused kernel and nothing reads the device, so the
    # host runs ahead of the GPU and fetches batches while it computes
    "fused": " [fused SGD]",
    # fused SGD, the loss read on the host every step (as a trainer logging it does), the next batch
    # fetched before that read: the fetch overlaps the step on the GPU
    "lookahead": " [fused SGD, next batch fetched before the loss is read]",
    # fused SGD, each step's loss tensor read (``.item()``) after the next step is launched ... or two or
    # three steps later. The read copies the loss
    # behind every kernel queued since, so each one waits until the GPU has nothing left: all three drain the
    # GPU's queue once a step, whatever the lag
    "lagged": " [fused SGD, loss read one step late]",
    "lagged2": " [fused SGD, loss read two steps late]",
    "lagged3": " [fused SGD, loss read three steps late]",
    # fused SGD, each step's loss copied to pinned host memory right after its step is launched (non-blocking,
    # with a CUDA event), read one or two steps later after that event: the host waits for that step only,
    # while the GPU runs the next one (what crossdali's trainer does)
    "copied": " [fused SGD, loss copied at its step, read one step late]",
    "copied2": " [fused SGD, loss copied at its step, read two steps late]",
}

#: how many steps late each ``TRAIN_LOOPS`` entry reads the loss on the host (0: only after the timed steps)
LOSS_LAG = {"lagged": 1, "lagged2": 2, "lagged3": 3, "copied": 1, "copied2": 2}


def _train_steps(loader, model, optimizer, scaler, device, steps: int, warmup: int = 10, *,
                 sync_each_step: bool = False, lookahead: bool = False, lag: int = 0, copy_loss: bool = False,
                 profile_steps: int = 0) -> dict:
    """``steps`` training steps after ``warmup`` untimed ones; the data wait of every step.

    The wait is the time the loop spends getting the next batch onto the device. Whether the host
    runs ahead of the GPU depends on the optimizer (``TRAIN_LOOPS``): with plain SGD, GradScaler
    waits for the device every step. ``sync_each_step`` also waits for the device after fetching every
    batch (what a loop that calls ``loss.item()`` right after the fetch does): the GPU then idles while
    the host fetches the batch and launches the first kernels of the step, which costs more the longer
    the host takes. ``lookahead`` fetches step k+1's batch after launching step k and before reading
    step k's loss (``loss.item()`` every step): that fetch is the step's data wait, overlapped with
    the GPU's work. ``lag`` > 0 reads step k's loss after launching step k + lag; ``copy_loss`` copies
    it to the host when step k is launched and waits for that copy only (crossdali's trainer).
    ``profile_steps`` more steps run under ``torch.profiler`` after the timed ones
    (``_kernel_time``)."""
    model.train()
    it = iter(_forever(loader))
    waits: list[float] = []
    n, start = 0, None
    ahead = next(it) if lookahead else None

    last_loss = None
    unread: collections.deque = collections.deque()

    def step_once() -> int:
        nonlocal ahead, last_loss
        t0 = time.perf_counter()
        images, labels = ahead if lookahead else next(it)
        images = images.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
        labels = labels.to(device, non_blocking=True)
        if sync_each_step:
            sync(device)  # the wait then includes the host-to-device copy
        wait = time.perf_counter() - t0
        # AMP on the GPU only: this measures GPU training; CPU autocast (bfloat16) is emulated and slow
        # on CPUs without AVX-512/AMX bfloat16 instructions
        with torch.autocast(device.type, dtype=torch.float16, enabled=device.type == "cuda"):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if lookahead:
            t1 = time.perf_counter()
            ahead = next(it)
            wait += time.perf_counter() - t1
            loss.item()
        waits.append(wait)
        last_loss = loss.detach()
        if lag:
            # the trainer's copy (crossdali.pytorch.training.copy_to_host), or the loss tensor itself
            unread.append(copy_to_host(last_loss) if copy_loss else (last_loss, None))
            while len(unread) > lag:
                value, copied = unread.popleft()
                if copied is not None:
                    copied.synchronize()
                value.item()
        return images.shape[0]

    for step in range(warmup + steps):
        if step == warmup:
            sync(device)
            waits, n, start = [], 0, time.perf_counter()
        n += step_once()
    sync(device)
    elapsed = time.perf_counter() - start
    ms = sorted(1000 * w for w in waits)
    row = {"img_s": n / elapsed, "data_wait_share": sum(waits) / elapsed, "steps": steps,
           "sync_each_step": sync_each_step, "step_ms": 1000 * elapsed / steps,
           "data_wait_ms": {"median": ms[len(ms) // 2], "p90": ms[int(0.9 * (len(ms) - 1))], "max": ms[-1]},
           "data_wait_ms_per_step": [round(1000 * w, 3) for w in waits],
           # a row whose weights turned NaN times other arithmetic than training does: it says so
           "final_loss": float(last_loss) if last_loss is not None else None}
    if row["final_loss"] is not None and not math.isfinite(row["final_loss"]):
        row["error"] = f"the training loss is {row['final_loss']} after the timed steps: not a valid training row"
    if profile_steps > 0 and device.type == "cuda":
        row["gpu_time"] = _kernel_time(lambda: [step_once() for _ in range(profile_steps)], profile_steps)
    return row


def _kernel_time(run, steps: int) -> dict:
    """GPU time per step of ``run()``'s ``steps`` steps by CUDA stream, from torch.profiler's CUDA
    activity (CUPTI sees every kernel and copy of the process, DALI's included): the stream with the
    most time is the model's (labelled so, an inference from the numbers); the others' top kernels name
    what DALI spent the SMs on: DALI's GPU work, done beside the model, is added to the step when the
    model keeps the SMs busy."""
    import json
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text()).get("traceEvents", [])
    streams: dict[str, dict] = {}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        s = streams.setdefault(str(e.get("args", {}).get("stream", "?")), {"us": 0.0, "kernels": {}})
        s["us"] += e.get("dur", 0.0)
        name = e.get("name", "?")[:120]
        s["kernels"][name] = s["kernels"].get(name, 0.0) + e.get("dur", 0.0)
    model = max(streams, key=lambda k: streams[k]["us"]) if streams else None
    out = {"steps": steps, "model_stream": model, "by_stream": {}}
    for sid, s in sorted(streams.items(), key=lambda kv: -kv[1]["us"]):
        top = sorted(s["kernels"].items(), key=lambda kv: -kv[1])[:6]
        out["by_stream"][sid] = {"ms_per_step": s["us"] / 1000 / steps,
                                 "top": [{"name": k, "ms_per_step": us / 1000 / steps} for k, us in top]}
    out["model_ms_per_step"] = out["by_stream"][model]["ms_per_step"] if model else 0.0
    out["other_ms_per_step"] = sum(v["ms_per_step"] for k, v in out["by_stream"].items() if k != model)
    return out


def _train_ratios(train: list[dict]) -> dict:
    """Each training row's images/s over the synthetic row's of the same round, sync mode, stream and
    loop (mean, min, max over the rounds), by the row's name without its round (``row``)."""
    def key(r: dict) -> tuple:
        return r["round"], r["sync_each_step"], r["model_stream"], r.get("loop", "scaler")

    timed = [r for r in train if "img_s" in r and "round" in r and "error" not in r]  # the warm-up row has no round
    synthetic = {key(r): r["img_s"] for r in timed if r["backend"] == "synthetic"}
    ratios: dict[str, list[float]] = {}
    for r in timed:
        if r["backend"] != "synthetic" and key(r) in synthetic:
            ratios.setdefault(r["row"], []).append(r["img_s"] / synthetic[key(r)])
    return {n: round_spread(v) for n, v in ratios.items()}


def _forever(loader):
    while True:
        yield from loader


def _shares(flag: str, text: str) -> list[float]:
    """A comma-separated list of hardware-decoder shares (0 to 1), or one line and exit 2."""
    try:
        shares = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        shares = [-1.0]
    if any(not 0.0 <= x <= 1.0 for x in shares):
        raise usage_error(f"{flag} {text!r}: give hw_decoder_load values from 0 to 1, comma-separated (e.g. 0.9,1)")
    return shares


def main(args: argparse.Namespace) -> dict:
    if args.cuda_queues != "unset":  # before anything starts CUDA: it reads the variable once
        if not args.cuda_queues.isdigit() or not 1 <= int(args.cuda_queues) <= QUEUES:
            raise usage_error(f"--cuda-queues {args.cuda_queues!r}: give 1 to {QUEUES}, or 'unset'")
        share_gpu_with_dali(int(args.cuda_queues))
    if args.smoke:
        # only checks that the script runs: a tiny model at 64 px in float32, since a 2-core CPU without
        # bfloat16 instructions trains ResNet-50 at 224 px under autocast at well under 1 image/s
        args.size, args.batch_size, args.workers, args.threads, args.hw_loads, args.train_steps = "tiny", 32, 2, "", "", 2
        args.pipelines = "2"
        args.min_seconds, args.train_warmup = 0.0, 1
        args.train_threads, args.arch, args.crop_size, args.train_sync = "", "resnet18", 64, "none"
    elif not torch.cuda.is_available():
        raise usage_error("this benchmark compares GPU-fed pipelines: run it on a machine with a CUDA GPU (or --smoke)")
    # parsed before any row runs, so a bad value fails before minutes of other rows
    args.hw_shares = _shares("--hw-loads", args.hw_loads)
    args.pipeline_hw_shares = _shares("--pipeline-hw-loads", args.pipeline_hw_loads)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    args.out.mkdir(parents=True, exist_ok=True)
    with EngineLoad(log=args.out / "dmon_classification.log") as load:
        return _measure(args, device, load)


def _measure(args: argparse.Namespace, device: torch.device, load: EngineLoad) -> dict:
    """Every loader row, then every train row, each with the engine load of its window."""
    t0 = time.perf_counter()
    root = ensure_classification(args.data_root, size=args.size, formats=("imagefolder",)) / "imagefolder"
    source = resolve_source(root, "train")
    sizes = [os.path.getsize(f) for f in source.files]
    print(f"data: {source.num_samples} JPEGs, mean {sum(sizes) / len(sizes) / 1024:.0f} KiB "
          f"(built/checked in {time.perf_counter() - t0:.0f} s)", flush=True)
    crop, bs, workers = args.crop_size, args.batch_size, args.workers
    common = dict(train=True, batch_size=bs, crop_size=crop)

    configs = [
        ("torchvision PIL ImageFolder", dict(kind="pil", workers=workers)),
        ("torchvision decode_image + v2 (native)", dict(backend="native", workers=workers)),
        (f"torchvision decode_jpeg on the {'GPU' if device.type == 'cuda' else 'CPU'} + v2",
         dict(kind="tv-decode-jpeg", workers=workers)),
        *((name, dict(kind=kind, workers=min(workers, SPDL_NVJPEG_CONCURRENCY) if kind == "spdl-nvjpeg" else workers))
          for name, kind in SPDL_ROWS.items()),
        ("DALI CPU", dict(backend="dali-cpu", workers=workers)),
    ]
    spdl_missing = _spdl_missing(source.files[0])
    for share in args.hw_shares:
        configs.append((f"DALI GPU hw_decoder_load={share:g}", dict(backend="dali-gpu", workers=workers, hw_decoder_load=share)))
    if args.global_order:  # the file reader's sharded order against GlobalOrderFiles + fn.io.file.read
        configs.append(("DALI CPU, global order", dict(backend="dali-cpu", workers=workers, global_order=True)))
        if device.type == "cuda":
            configs.append(("DALI GPU hw_decoder_load=1, global order",
                            dict(backend="dali-gpu", workers=workers, hw_decoder_load=1.0, global_order=True)))
    for policy in (x for x in args.auto_augment.split(",") if x):  # checked by the loader factory
        configs.append((f"DALI CPU, {policy}", dict(backend="dali-cpu", workers=workers, auto_augment=policy)))
        if device.type == "cuda":
            configs.append((f"DALI GPU hw_decoder_load=1, {policy}",
                            dict(backend="dali-gpu", workers=workers, hw_decoder_load=1.0, auto_augment=policy)))
    for threads in (int(x) for x in args.threads.split(",") if x):
        if threads != workers:
            configs.append((f"DALI GPU hw_decoder_load=1 {threads} threads",
                            dict(backend="dali-gpu", workers=threads, hw_decoder_load=1.0)))
    for k in (int(x) for x in args.pipelines.split(",") if x):  # the same threads in all, split over k pipelines
        split = dict(workers=max(1, workers // k), pipelines=k)
        configs.append((f"DALI CPU, {k} pipelines", dict(backend="dali-cpu", **split)))
        if device.type == "cuda":
            for share in args.pipeline_hw_shares:
                configs.append((f"DALI GPU hw_decoder_load={share:g}, {k} pipelines",
                                dict(backend="dali-gpu", hw_decoder_load=share, **split)))
    if args.only:
        configs = [c for c in configs if any(o in c[0] for o in args.only)]

    results, train = [], []
    report = {
        **environment("classification_loaders", device),
        "dataset": {"images": source.num_samples, "mean_kib": sum(sizes) / len(sizes) / 1024},
        "batch_size": bs,
        "transform": f"decode + random-resized-crop {crop} + flip + normalize, float NCHW on the {device.type.upper()}",
        "train_model": f"{args.arch}, channels-last, " + ("AMP float16" if device.type == "cuda" else "float32 (no CPU AMP)"),
        "timing": (f"loader: 1 warm-up epoch, then whole epochs timed until >= 2 epochs and >= {args.min_seconds:g} s; "
                   f"train: {args.train_warmup} warm-up steps, then --train-steps timed; engine_load: nvidia-smi dmon "
                   "means over a loader row's timed epochs and a train row's warm-up + timed steps"),
        "train_last_batch": args.train_last_batch,
        "spdl": _spdl_version(),
        "loader": results,
        "train": train,
    }
    path = args.out / "classification_loaders.json"
    for name, cfg in [] if args.skip_loader else configs:
        kind = cfg.pop("kind", None)
        row = {"name": name, "backend": kind or cfg["backend"], "threads": cfg["workers"],
               "hw_decoder_load": cfg.get("hw_decoder_load"), "pipelines": cfg.get("pipelines", 1),
               "global_order": cfg.get("global_order", False), "auto_augment": cfg.get("auto_augment", "none")}
        if kind in SPDL_ROWS.values() and (spdl_missing or (kind == "spdl-nvjpeg" and device.type != "cuda")):
            row["skipped"] = spdl_missing or "no CUDA device here: nvJPEG decodes on the GPU"
            print(f"{name:52s} skipped: {row['skipped'][:120]}", flush=True)
            results.append(row)
            write_report(path, report)
            continue
        intra_op = torch.get_num_threads()
        try:  # one failing configuration is recorded with its error; the others still run
            if kind in SPDL_ROWS.values():
                # One torch intra-op thread per SPDL worker thread, as every DataLoader worker process
                # has: 15 threads each opening a full OpenMP team oversubscribe the cores
                torch.set_num_threads(1)
                row["torch_intra_op_threads"] = 1
            if kind == "pil":
                loader = _pil_imagefolder_loader(source, batch_size=bs, workers=cfg["workers"], crop=crop)
            elif kind == "tv-decode-jpeg":
                loader = _TorchvisionGPUDecodeLoader(source, batch_size=bs, workers=cfg["workers"], crop=crop,
                                                     device=device)
            elif kind in SPDL_ROWS.values():
                loader = _spdl_loader(kind, source, batch_size=bs, workers=cfg["workers"], crop=crop, device=device)
            else:
                loader = create_classification_loader(source, **common, **cfg, device_id=0)
            row.update(time_epochs(loader, device, min_seconds=args.min_seconds))
            end = time.perf_counter()
            row["engine_load"] = load.mean(end - row["seconds"], end)  # the timed epochs, not the warm-up one
            print(f"{name:52s} {row['img_s']:9,.0f} img/s{_engine_text(row['engine_load'])}", flush=True)
            del loader
        except Exception as e:  # reported in the JSON
            row["error"] = _error_text(e)
            print(f"{name:52s} FAILED: {row['error']}", flush=True)
        finally:
            torch.set_num_threads(intra_op)
        results.append(row)
        write_report(path, report)

    if not args.skip_train:
        import torchvision

        # cuDNN's autotuner on unless CUDNN_BENCHMARK=0 (crossdali's training scripts run without it, for
        # reproducible results)
        torch.backends.cudnn.benchmark = report["cudnn_benchmark"] = os.environ.get("CUDNN_BENCHMARK", "1") != "0"
        train_configs = [("synthetic", dict(backend="synthetic", workers=workers))]
        train_configs += [(f"DALI GPU hw_decoder_load=1 {t} threads", dict(backend="dali-gpu", workers=t, hw_decoder_load=1.0))
                          for t in (int(x) for x in args.train_threads.split(",") if x)]
        train_configs += [("DALI CPU", dict(backend="dali-cpu", workers=workers)),
                          ("torchvision decode_image + v2 (native)", dict(backend="native", workers=workers))]
        wanted = {b.strip() for b in args.train_backends.split(",") if b.strip()}
        if not wanted or wanted - {"synthetic", "dali-gpu", "dali-cpu", "native"}:
            raise usage_error(f"--train-backends {args.train_backends!r}: give some of synthetic, dali-gpu, dali-cpu, native")
        if args.train_rounds < 1:
            raise usage_error(f"--train-rounds {args.train_rounds}: give 1 or more")
        train_configs = [(n, c) for n, c in train_configs if c["backend"] in wanted]
        if device.type == "cuda" and any(c["backend"] == "dali-gpu" for _, c in train_configs):
            # The first DALI GPU pipeline that runs next to the model trains slowly for a while (a fraction
            # of the later rows' rate, whatever the thread count): a one-off start-up cost, so an untimed
            # row absorbs it; the JSON keeps its number.
            train_configs.insert(1, ("warm-up (first DALI GPU pipeline, not a result)",
                                     dict(backend="dali-gpu", workers=workers, hw_decoder_load=1.0)))
        modes = [m.strip() for m in args.train_sync.split(",") if m.strip()]
        if not modes or set(modes) - {"none", "step"}:
            raise usage_error(f"--train-sync {args.train_sync!r}: give 'none', 'step' or 'none,step'")
        streams = [m.strip() for m in args.train_stream.split(",") if m.strip()]
        if not streams or set(streams) - {"default", "high"}:
            raise usage_error(f"--train-stream {args.train_stream!r}: give 'default', 'high' or 'default,high'")
        loops = [m.strip() for m in args.train_loop.split(",") if m.strip()]
        if not loops or set(loops) - set(TRAIN_LOOPS):
            raise usage_error(f"--train-loop {args.train_loop!r}: give some of {', '.join(TRAIN_LOOPS)}")
        if args.train_profile_steps < 0:
            raise usage_error(f"--train-profile-steps {args.train_profile_steps}: give 0 or more")
        try:
            depths = [int(x) for x in args.train_prefetch.split(",") if x.strip()]
        except ValueError:
            depths = []
        if not depths or min(depths) < 1:
            raise usage_error(f"--train-prefetch {args.train_prefetch!r}: give positive integers, e.g. 2,4")
        warm = lambda name: name.startswith("warm-up")  # noqa: E731
        dali = lambda cfg: cfg["backend"].startswith("dali")  # noqa: E731
        train_configs = [(n + (f" [prefetch {d}]" if d not in (None, 2) else ""), {**c, "prefetch_queue_depth": d} if d else c)
                         for n, c in train_configs for d in (depths if dali(c) and not warm(n) else [None])]
        runs = [(name, cfg, mode, stream, loop) for name, cfg in train_configs
                for loop in (loops if not warm(name) else ["scaler"])
                for mode in (modes if not warm(name) else ["none"])
                for stream in (streams if cfg["backend"] in ("synthetic", "dali-gpu") and not warm(name)
                               and device.type == "cuda" else ["default"])]
        # (round None: the untimed warm-up row, run once before the rounds)
        runs = [(*run, None) for run in runs if warm(run[0])] + [
            (*run, k + 1) for k in range(args.train_rounds) for run in runs if not warm(run[0])]
        for base_name, cfg, mode, stream, loop, rnd in runs:
            if cfg["backend"] == "dali-gpu" and device.type != "cuda":
                continue
            row_name = base_name + TRAIN_LOOPS[loop] + (" [device sync every step]" if mode == "step" else "") + (
                " [model on a high-priority stream]" if stream == "high" else "")
            name = f"{row_name} (round {rnd})" if args.train_rounds > 1 and rnd else row_name
            row = {"name": name, "row": row_name, "backend": cfg["backend"], "threads": cfg["workers"],
                   "prefetch_queue_depth": cfg.get("prefetch_queue_depth"), "model_stream": stream, "loop": loop,
                   **({"round": rnd} if rnd else {})}
            try:
                model = torchvision.models.get_model(args.arch, num_classes=source.num_classes)
                model = model.to(device).to(memory_format=torch.channels_last)
                # crossdali's optimizer factory: fused SGD needs its momentum buffers made first (its docstring)
                optimizer = create_optimizer("sgd", model.parameters(), lr=0.1, momentum=0.9, fused=loop != "scaler")
                scaler = torch.amp.GradScaler(device.type, enabled=device.type == "cuda")
                loader = create_classification_loader(source, **common, **cfg, device_id=0,
                                                      last_batch=args.train_last_batch)
                start = time.perf_counter()
                # torch maps a priority below its range to the highest one; DALI's iterator copies each
                # batch on the current stream, so the order between DALI and the model is kept
                on_stream = torch.cuda.stream(torch.cuda.Stream(device, priority=-100)) if stream == "high" \
                    else contextlib.nullcontext()
                with on_stream:
                    row.update(_train_steps(loader, model, optimizer, scaler, device, args.train_steps,
                                            args.train_warmup, sync_each_step=mode == "step",
                                            lookahead=loop == "lookahead",
                                            lag=LOSS_LAG.get(loop, 0), copy_loss=loop.startswith("copied"),
                                            profile_steps=args.train_profile_steps))
                row["engine_load"] = load.mean(start, time.perf_counter())
                print(f"train {name:46s} {row['img_s']:9,.0f} img/s  data wait {100 * row['data_wait_share']:.1f} % "
                      f"(median {row['data_wait_ms']['median']:.2f} ms/step){_engine_text(row['engine_load'])}",
                      flush=True)
                if "error" in row:
                    print(f"      INVALID: {row['error']}", flush=True)
                if "gpu_time" in row:
                    g = row["gpu_time"]
                    print(f"      GPU ms/step: busiest stream (the model's) {g['model_ms_per_step']:.2f}, "
                          f"other streams {g['other_ms_per_step']:.2f}", flush=True)
                del loader, model, optimizer
            except Exception as e:  # reported in the JSON
                row["error"] = f"{type(e).__name__}: {e}"
                print(f"train {name:46s} FAILED: {row['error']}", flush=True)
            train.append(row)
            write_report(path, report)

    if train:
        report["train_vs_synthetic"] = _train_ratios(train)
        for name, r in report["train_vs_synthetic"].items():
            print(f"train {name}: {100 * r['mean']:.1f} % of synthetic (rounds {100 * r['min']:.1f}-{100 * r['max']:.1f} %)")
    by_name = {r["name"]: r["img_s"] for r in results if "img_s" in r}
    for key, base in (("speedup_vs_native", "torchvision decode_image + v2 (native)"),
                      ("speedup_vs_pil", "torchvision PIL ImageFolder")):
        if base in by_name:
            report[key] = {name: img_s / by_name[base] for name, img_s in by_name.items()}
    write_report(path, report)
    png = path.with_suffix(".png")
    if any("img_s" in r for r in results) or any("img_s" in r for r in train):  # matplotlib optional: no PNG without
        plot_classification(report, png)
    print(f"wrote {path}" + (f" and {png}" if png.exists() else ""))
    return report


if __name__ == "__main__":
    main(get_args_parser().parse_args())
