"""Inference preprocessing in DALI's dynamic mode (``nvidia.dali.experimental.dynamic``): the val
transform called operator by operator on the images at hand, with no pipeline to build or feed.

A pipeline (``crossdali.common.inference.InferencePipeline``) is a graph built once for a fixed
largest batch and run through DALI's executor; dynamic mode calls the same DALI operators directly
from Python, each on the batch it is given. For a request of a few images that skips the
executor's per-run work and the pipeline's build (the first ``crossdali predict`` call does not
pay for one). ``crossdali.common.inference.choose_engine`` says which of the two serves a request.

It runs on the CPU only: on a GPU the pipeline engine was as fast, and DALI's eager GPU decoder could
differ from the val pipeline's pixels, so ``device="gpu"`` is refused with a ``UsageError``
(docs/inference.md#eager-is-cpu-only).

The steps and their arguments are those of ``augment_classification(train=False)`` in
``crossdali.common.classification``: decode to RGB, resize the shorter side with torchvision's
rounding, centre crop with torchvision's anchor, normalize, layout. The val geometry, which the
pipeline computes with DALI arithmetic on ``peek_image_shape``, is computed here in Python on the
same shapes with the same integer and float32 operations, so the output is bit-identical to the
pipeline's (``tests/common/test_eager_predict.py`` holds them to that).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from crossdali.common.classification import ClassificationTransform
from crossdali.common.inference import check_engine
from crossdali.common.options import PipelineOptions

if TYPE_CHECKING:
    from crossdali.common.inference import EncodedImage

__all__ = ["EagerPreprocessor", "val_geometry"]


def val_geometry(height: int, width: int, *, resize: int, crop: int) -> tuple[int, int, np.float32, np.float32]:
    """``(out_h, out_w, crop_pos_y, crop_pos_x)`` of the val transform for an image of ``height`` x ``width``.

    The shorter side becomes ``resize`` and the longer one ``resize * longer // shorter``
    (torchvision's ``Resize(int)`` truncates); the crop anchor is torchvision's
    ``int(round((n - crop) / 2))`` (half to even), given to DALI as a float32 fraction of
    ``n - crop``. The same arithmetic as ``crossdali.common.classification._val_geometry``, which
    does it inside the pipeline graph.
    """
    longer = (resize * max(height, width)) // min(height, width)
    out_h, out_w = (resize, longer) if height <= width else (longer, resize)

    def centre(n: int) -> np.float32:
        d = n - crop
        half = d // 2
        anchor = half + (d % 2) * (half % 2)
        return np.float32(anchor) / np.float32(max(d, 1))  # float32 / float32, as DALI divides

    return out_h, out_w, centre(out_h), centre(out_w)


class EagerPreprocessor:
    """The val transform of 1 to any number of encoded images, in DALI's dynamic mode, on the CPU.

    ``options`` gives the CPU threads (``num_threads``); its ``batch_size`` is not a limit here.
    ``device="gpu"`` raises ``UsageError`` before any CUDA work (the engine is CPU-only: the module's
    docstring says why).

    ``run(images)`` returns DALI's evaluated ``Batch`` (N, C, H, W) (or (N, H, W, C));
    ``run(images, convert=ndd.Batch.torch)`` also converts it (DLPack) inside this preprocessor's
    context: a conversion called outside it would run in the calling thread's default
    ``EvalContext`` (another executor thread and thread pool of DALI's making). One preprocessor
    serves one thread at a time (DALI's ``EvalContext`` refuses a second).

    Every operator runs in the calling thread (``EvalMode.sync_cpu``), not in the context's
    background executor thread. The context is made for DALI's ``cpu`` device: by default DALI gives
    a context the current GPU where one is visible, which would bind the preprocessor's threads to it.

    DALI keeps the operators it makes in this preprocessor's ``EvalContext``, one set per
    power-of-two run size (1, 2, 3-4, 5-8, ...): the first run of each size class makes its own,
    later ones reuse them.
    """

    def __init__(self, *, options: PipelineOptions, transform: ClassificationTransform | None = None) -> None:
        check_engine("eager", device=options.device)  # first: a GPU is refused before DALI or CUDA starts
        import nvidia.dali.experimental.dynamic as ndd  # defer: keeps `import crossdali.common` light

        self.options, self.transform = options, transform or ClassificationTransform()
        with ndd.Device("cpu"):  # else DALI takes the current GPU for the context, where one is visible
            self._context = ndd.EvalContext(num_threads=max(1, options.num_threads))

    def run(self, images: Sequence[EncodedImage], *, convert: Callable | None = None):
        """The val transform of ``images`` as an evaluated DALI dynamic-mode ``Batch``, or what
        ``convert`` (e.g. ``ndd.Batch.torch``) makes of it, called inside this preprocessor's context.

        A failure (an image DALI cannot decode) raises DALI's ``RuntimeError`` here, not later.
        """
        import nvidia.dali.experimental.dynamic as ndd
        from nvidia.dali import types

        if not images:
            raise ValueError("a run takes at least one image")
        t = self.transform
        with self._context, ndd.EvalMode.sync_cpu:
            encoded = ndd.as_batch([im.data for im in images])  # views: no copy, no copy operator
            shapes = ndd.peek_image_shape(encoded).evaluate()
            geometry = [val_geometry(int(s[0]), int(s[1]), resize=t.val_resize_size, crop=t.crop_size)
                        for s in (np.asarray(x) for x in shapes.tensors)]
            out_h, out_w, crop_y, crop_x = ([g[i] for g in geometry] for i in range(4))
            # the pipeline's memory paddings are left out: they size pools for a stream of batches, and a
            # request of a few images would pay for them up front; pixels do not depend on them
            decoded = ndd.decoders.image(encoded, device="cpu", output_type=types.RGB)
            as_float = lambda values: ndd.as_batch([np.float32(v) for v in values])  # noqa: E731 - per-sample arguments
            resized = ndd.resize(decoded, resize_x=as_float(out_w), resize_y=as_float(out_h),
                                 interp_type=types.INTERP_LINEAR, antialias=True)
            out = ndd.crop_mirror_normalize(
                resized, dtype=types.FLOAT16 if t.dtype == "float16" else types.FLOAT, output_layout=t.output_layout,
                crop=(t.crop_size, t.crop_size), mean=list(t.mean), std=list(t.std), mirror=False,
                crop_pos_x=as_float(crop_x), crop_pos_y=as_float(crop_y))
            out = out.evaluate()
            return out if convert is None else convert(out)
