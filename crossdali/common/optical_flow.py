"""The optical-flow pipeline, defined once for every framework: ``fn.optical_flow`` (the GPU's
optical-flow engine, Turing or newer) on consecutive frames from the clip reader. It has no CPU
backend; on a machine without such a GPU ``require_optical_flow_hardware`` raises an error that
says what is needed.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

from crossdali.common.data.videos import check_videos
from crossdali.common.options import PipelineOptions
from crossdali.common.video import ClipTransform, video_reader

__all__ = [
    "OpticalFlowUnavailable",
    "create_optical_flow_pipeline",
    "flow_to_frame_pixels",
    "require_optical_flow_hardware",
]


class OpticalFlowUnavailable(RuntimeError):
    """``fn.optical_flow`` cannot run here: it needs an NVIDIA GPU with the optical-flow engine."""


def _compute_capability(device_id: int) -> tuple[int, int] | None:
    """(major, minor) of GPU ``device_id`` from the CUDA driver, or None without a driver."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    dev, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(dev), device_id) != 0:
        return None
    cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)  # ..._MINOR
    return major.value, minor.value


_OF_NEEDS = ("DALI's optical flow runs only on the optical-flow engine of an NVIDIA GPU of the Turing "
             "generation or newer (compute capability 7.5+, e.g. T4, RTX 20xx/30xx/40xx, A10, A100, L4 and later); "
             "there is no CPU implementation")


def require_optical_flow_hardware(device: str, device_id: int | None) -> None:
    """Raise ``OpticalFlowUnavailable`` unless ``device_id`` is a GPU with an optical-flow engine."""
    if device != "gpu" or device_id is None:
        raise OpticalFlowUnavailable(f"{_OF_NEEDS}; this run asked for device={device!r}. Run it on such a GPU "
                                     "with device='gpu' and a device_id.")
    from nvidia.dali.backend import GetCUDADeviceCount

    count = GetCUDADeviceCount()
    if count <= device_id:
        raise OpticalFlowUnavailable(f"{_OF_NEEDS}; this machine shows {count} CUDA GPU(s), so GPU {device_id} "
                                     "does not exist. Run it on a machine with such a GPU.")
    cc = _compute_capability(device_id)
    if cc is not None and cc < (7, 5):
        raise OpticalFlowUnavailable(f"{_OF_NEEDS}; GPU {device_id} has compute capability {cc[0]}.{cc[1]}.")


def create_optical_flow_pipeline(
    files: Sequence[str],
    *,
    options: PipelineOptions,
    labels: Sequence[int] | None = None,
    sequence_length: int = 2,
    stride: int = 1,
    step: int | None = None,
    flow_size: int | None = 256,
    output_grid: int = 4,
    preset: float = 0.5,
    validate: bool = True,
):
    """Frames and the optical flow between consecutive frames of clips read from ``files`` (GPU).

    Outputs ``(frames, flow, labels)``: uint8 ``(F, H, W, 3)`` frames as decoded, float32
    ``(F-1, S/grid, S/grid, 2)`` flow (x, y) and the int64 labels. With ``flow_size=S`` the frames
    are resized to S x S before the flow engine (the same grid for every file, and enough blocks
    for small frames), so the vectors are in pixels of that S x S image:
    ``flow_to_frame_pixels`` scales them back. Raises ``OpticalFlowUnavailable`` where there is
    no GPU with an optical-flow engine.

    Args:
        files: the video files, read in order.
        options: where and how the pipeline runs; ``device`` must be ``"gpu"``.
        labels: one label per file (default: 0 for all).
        sequence_length: frames per sequence, at least 2.
        stride: distance between the frames of a sequence.
        step: distance between the first frames of consecutive sequences (default
            ``sequence_length * stride``).
        flow_size: side S of the square the frames are resized to for the flow engine; ``None``:
            the frames as decoded.
        output_grid: the flow vectors' grid in pixels: 1, 2 or 4.
        preset: the optical-flow engine's speed/quality preset, 0 (quality) to 1 (speed).
        validate: probe every file first (``crossdali.common.data.videos.check_videos``).
    """
    from nvidia.dali import fn, pipeline_def, types  # defer

    require_optical_flow_hardware(options.device, options.device_id)
    if sequence_length < 2:
        raise ValueError(f"optical flow needs at least 2 frames per sequence, got sequence_length={sequence_length}")
    if output_grid not in (1, 2, 4):
        raise ValueError(f"output_grid must be 1, 2 or 4 (4 only on Turing), got {output_grid}")
    files = list(files)
    labels = list(labels) if labels is not None else [0] * len(files)
    sampling = ClipTransform(sequence_length=sequence_length, stride=stride, step=step)
    if validate:
        check_videos(files, device="gpu", transform=sampling)
    opts = options

    @pipeline_def(batch_size=opts.batch_size, num_threads=opts.num_threads, device_id=opts.device_id,
                  seed=opts.seed, prefetch_queue_depth=opts.prefetch_queue_depth)
    def optical_flow_pipeline():
        frames, lbl = video_reader(files, labels, sequence_length=sequence_length, stride=stride,
                                    step=sampling.clip_step, shuffle=False, opts=opts)
        flow_in = frames
        if flow_size:
            flow_in = fn.resize(frames, size=(flow_size, flow_size), interp_type=types.INTERP_LINEAR)
        flow = fn.optical_flow(flow_in, output_grid=output_grid, preset=preset,
                               enable_temporal_hints=sequence_length > 2)
        return frames, flow, fn.cast(lbl, dtype=types.INT64)

    return optical_flow_pipeline()


def flow_to_frame_pixels(flow, frame_hw: tuple[int, int], flow_size: int | None):
    """Flow from ``create_optical_flow_pipeline`` as the motion of the content from frame i to frame
    i+1, in pixels of the decoded ``(H, W)`` frames (x right, y down).

    DALI's raw vectors point the other way, from frame i+1 back to frame i (the optical-flow
    engine's input-to-reference convention), as clips whose motion is known show
    (``tests/video/test_video_gpu.py``: a rising patch gives dy > 0 raw), so the sign is flipped here."""
    if not flow_size:
        return -flow
    h, w = frame_hw
    scale = flow.dtype.type(w / flow_size), flow.dtype.type(h / flow_size)
    return flow * [-scale[0], -scale[1]]
