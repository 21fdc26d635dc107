"""Where a DALI pipeline's TensorFlow tensors live, and GPU memory that DALI can still get.

TensorFlow reserves nearly all memory of a GPU the first time it touches it. DALI's decoders
(nvJPEG, the hardware JPEG decoder, NVDEC) allocate their own memory afterwards and then fail:
with TF 2.21 the hardware JPEG decoder reports ``nvjpeg error #5`` and DALI falls back to the
slower CUDA decoder without saying so. Memory growth (TF takes memory as it needs it) can
only be turned on before TF initialises its GPUs, so the ``dali-gpu`` loader factories and the
train script turn it on first thing.
"""

from __future__ import annotations

import logging

import tensorflow as tf

__all__ = ["enable_memory_growth", "tf_device"]

log = logging.getLogger(__name__)


def enable_memory_growth(*, strict: bool = False) -> bool:
    """Turn on memory growth for every GPU visible to TensorFlow; True if it is on (or not needed).

    Leaves GPUs alone that already have growth or a memory limit (a logical device configuration:
    the caller's choice). Too late, when TF has already initialised its GPUs: a warning (an error
    with ``strict``) that says what to do, and False.
    """
    gpus = [g for g in tf.config.get_visible_devices("GPU")
            if not tf.config.experimental.get_memory_growth(g) and not tf.config.get_logical_device_configuration(g)]
    if not gpus:
        return True
    try:
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError as e:  # "Physical devices cannot be modified after being initialized"
        message = (f"TensorFlow already initialised {', '.join(g.name for g in gpus)} without memory growth: it holds "
                   "nearly all GPU memory, and DALI's GPU decoders may fail to allocate (the hardware JPEG decoder "
                   "then falls back to the slower CUDA decoder). Create the dali-gpu loader before any TensorFlow op "
                   "runs on the GPU, or call crossdali.tensorflow.enable_memory_growth() (or "
                   "tf.config.experimental.set_memory_growth) at the start of the program.")
        if strict:
            raise RuntimeError(message) from e
        log.warning(message)
        return False
    log.info("TensorFlow GPU memory growth on for %s (DALI allocates beside TF)", ", ".join(g.name for g in gpus))
    return True


def tf_device(device_id: int | None) -> str:
    """TensorFlow's name for the device a DALI pipeline runs on: ``/CPU:0`` for ``device_id=None``,
    else the TF GPU that is CUDA device ``device_id``.

    A training script usually makes only its own GPU visible to TF (``set_visible_devices``): it
    is then ``/GPU:0`` for TF while DALI still counts CUDA devices.
    """
    if device_id is None:
        return "/CPU:0"
    visible = tf.config.get_visible_devices("GPU")
    if not visible:
        raise RuntimeError("--data-backend dali-gpu needs a GPU visible to TensorFlow and none is "
                           "(tensorflow-cpu is installed, or CUDA is not set up); use dali-cpu")
    physical = [g.name.rsplit(":", 1)[-1] for g in visible]  # "/physical_device:GPU:3" -> "3"
    if str(device_id) in physical:
        return f"/GPU:{physical.index(str(device_id))}"
    if len(visible) == 1:  # e.g. CUDA_VISIBLE_DEVICES names one GPU
        return "/GPU:0"
    raise ValueError(f"device_id={device_id} is not one of the GPUs visible to TensorFlow "
                     f"({', '.join(g.name for g in visible)}); pass the local GPU index")
