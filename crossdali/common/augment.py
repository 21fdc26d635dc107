"""Automatic augmentation policies (DALI's ``nvidia.dali.auto_aug``) for the classification train pipeline.

``--auto-augment`` picks one; ``ClassificationTransform.auto_augment`` carries it into
``crossdali.common.classification.augment_classification``, which applies it to the uint8 crop
after the random-resized crop and before normalisation and the flip, in every framework, on the
CPU and on the GPU (every operator of the three policies has a CPU implementation in DALI).

- ``autoaugment``: AutoAugment's ImageNet policy (Cubuk et al., 2019): one of 25 learned pairs of
  operations per image, each applied with its own probability and magnitude.
- ``randaugment``: RandAugment (Cubuk et al., 2020): 2 operations drawn uniformly from 14, at
  magnitude 9 of 31 (torchvision's defaults).
- ``trivialaugment``: TrivialAugment Wide (Mueller and Hutter, 2021): 1 operation from 14 at a
  random magnitude.

Translations are relative to the crop, so they scale with ``--crop-size``; at 224 they are the
published ranges (DALI's defaults: AutoAugment 250 px, RandAugment 100 px, TrivialAugment 32 px).
Every random choice comes from random operators seeded by the pipeline's seed (no ``seed``
argument here), so the seed fixes the augmentation as it fixes the crop and the flip: the same
seed gives the same pixels in every framework, and each shard gets its own augmentation seed
(``PipelineOptions.augmentation_seed``).

DALI spells a policy's per-sample choice with conditionals (``if`` on a ``DataNode``), so a
pipeline that applies one is defined with ``enable_conditionals=True``
(``pipeline_conditionals``). The policies cost throughput: docs/benchmarks.md#auto-augment.
"""

from __future__ import annotations

import warnings

from crossdali.common.errors import UsageError
from crossdali.common.options import DALI_BACKENDS

__all__ = ["AUTO_AUGMENT_POLICIES", "AUTO_AUGMENT_HELP", "apply_auto_augment", "check_auto_augment",
           "pipeline_conditionals"]

#: ``--auto-augment`` choices; ``none`` is the plain recipe (crop, flip, normalise).
AUTO_AUGMENT_POLICIES = ("none", "autoaugment", "randaugment", "trivialaugment")

#: ``--auto-augment``'s help text: what each policy does, and that it costs throughput.
AUTO_AUGMENT_HELP = (
    "augmentation policy of the train pipeline, after the random-resized crop, the same pixels in every framework "
    "for a given --seed (DALI's nvidia.dali.auto_aug): none: crop, flip, normalise only; autoaugment: AutoAugment's "
    "ImageNet policy (one of 25 learned pairs of operations); randaugment: RandAugment, 2 of 14 operations at "
    "magnitude 9/31; trivialaugment: TrivialAugment Wide, 1 of 14 operations at a random magnitude. The policies "
    "help longer trainings of larger models and cost loader throughput (docs/benchmarks.md#auto-augment); DALI "
    "backends only"
)

#: RandAugment's number of operations per image and magnitude bin (of 31): torchvision's and timm's rand-m9-n2.
RANDAUGMENT_N, RANDAUGMENT_M = 2, 9
#: TrivialAugment Wide's largest shift as a share of the crop: the paper's 32 px on a 224 crop.
TRIVIALAUGMENT_MAX_TRANSLATE = 32 / 224


def check_auto_augment(policy: str, *, backend: str | None = None) -> str:
    """``policy`` when it is a known name that ``backend`` can run (None: any DALI backend), else a
    ``UsageError`` naming the flag and the fix: the policies run inside crossdali's DALI train
    pipeline, not in a framework's own loader nor on synthetic tensors."""
    if policy not in AUTO_AUGMENT_POLICIES:
        raise UsageError(f"--auto-augment {policy!r}: choose one of {', '.join(AUTO_AUGMENT_POLICIES)}")
    if policy != "none" and backend is not None and backend not in DALI_BACKENDS:
        raise UsageError(f"--auto-augment {policy} runs in the DALI train pipeline and --data-backend {backend} has "
                         f"none; use --data-backend {' or '.join(DALI_BACKENDS)}, or --auto-augment none")
    return policy


def pipeline_conditionals(policy: str) -> dict:
    """The ``pipeline_def`` arguments a pipeline applying ``policy`` needs: DALI's conditionals for a
    policy, nothing for ``none`` (which leaves the pipeline exactly as it was)."""
    return {"enable_conditionals": True} if policy != "none" else {}


def apply_auto_augment(images, policy: str, *, crop_size: int):
    """``images`` (uint8 HWC ``DataNode`` of ``crop_size`` x ``crop_size``, CPU or GPU) through ``policy``.

    Called inside a pipeline defined with ``pipeline_conditionals(policy)``; ``none`` returns
    ``images`` unchanged (no operator added).
    """
    check_auto_augment(policy)
    if policy == "none":
        return images
    from nvidia.dali.pipeline import Pipeline  # defer: keeps `import crossdali.common` light

    pipe = Pipeline.current()
    if pipe is not None and not getattr(pipe, "_conditionals_enabled", True):
        raise ValueError(f"auto_augment={policy!r} needs a pipeline defined with enable_conditionals=True "
                         "(crossdali.common.augment.pipeline_conditionals)")
    from nvidia.dali.auto_aug import auto_augment, rand_augment, trivial_augment

    shape = (crop_size, crop_size)
    # auto_aug still calls fn.experimental.equalize/filter, which DALI reports as deprecated aliases on
    # every build (under its own "default" filter, so only recording them keeps them out of the logs);
    # nothing a user of this pipeline can act on. Any other warning is passed on.
    with warnings.catch_warnings(record=True) as caught:
        if policy == "autoaugment":
            images = auto_augment.auto_augment_image_net(images, shape=shape)
        elif policy == "randaugment":
            images = rand_augment.rand_augment(images, n=RANDAUGMENT_N, m=RANDAUGMENT_M, shape=shape)
        else:
            images = trivial_augment.trivial_augment_wide(images, shape=shape,
                                                          max_translate_rel=TRIVIALAUGMENT_MAX_TRANSLATE)
    for w in caught:
        if not (issubclass(w.category, DeprecationWarning) and "is now deprecated" in str(w.message)):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return images
