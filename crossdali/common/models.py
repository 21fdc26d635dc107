"""One model vocabulary for every framework: ``--arch NAME`` means the same architecture in each
framework that has it.

``MODELS`` maps a name to the builder of each framework that has that architecture: torchvision's
``get_model`` name, the ``tf.keras.applications`` function, the flax module of
``crossdali.jax.models``, the Gluon model zoo name. A name with no builder for a framework is not
available there, and ``--arch`` says which frameworks have it. Names are torchvision's where
torchvision has the model; the others keep their own framework's spelling. ``ALIASES`` accepts the
Keras and Gluon spellings (``mobilenetv2``, ``efficientnetb0``, ``resnet50_v1``, ...) for the same
models.

Nothing here imports a framework: the training scripts' parsers check ``--arch`` against this table
(``arch_type``) before PyTorch, TensorFlow, JAX or MXNet load. ``crossdali models`` prints it.
"""

from __future__ import annotations

import argparse
import difflib
import textwrap
from collections.abc import Callable

__all__ = ["FRAMEWORKS", "MODELS", "ALIASES", "VIDEO_MODELS", "ModelNameError", "canonical_name", "builder_name", "models_for",
           "arch_type", "format_table"]

FRAMEWORKS = ("pytorch", "tensorflow", "jax", "mxnet")
LIST_COMMAND = "crossdali models"

# name: (pytorch, tensorflow, jax, mxnet) builder names; None where that framework has no such model.
_SHARED: dict[str, tuple[str | None, str | None, str | None, str | None]] = {
    "small_cnn": ("small_cnn", "small_cnn", "small_cnn", None),
    "resnet18": ("resnet18", None, "resnet18", "resnet18_v1"),
    "resnet34": ("resnet34", None, "resnet34", "resnet34_v1"),
    "resnet50": ("resnet50", "ResNet50", "resnet50", "resnet50_v1"),
    "resnet101": ("resnet101", "ResNet101", None, "resnet101_v1"),
    "resnet152": ("resnet152", "ResNet152", None, "resnet152_v1"),
    # pre-activation ResNets (He et al., 2016): Keras' and Gluon's "v2"; torchvision has none
    "resnet18_v2": (None, None, None, "resnet18_v2"),
    "resnet34_v2": (None, None, None, "resnet34_v2"),
    "resnet50_v2": (None, "ResNet50V2", None, "resnet50_v2"),
    "resnet101_v2": (None, "ResNet101V2", None, "resnet101_v2"),
    "resnet152_v2": (None, "ResNet152V2", None, "resnet152_v2"),
    "mobilenet_v1": (None, "MobileNet", None, "mobilenet1.0"),
    "mobilenet_v2": ("mobilenet_v2", "MobileNetV2", None, "mobilenetv2_1.0"),
    "mobilenet_v3_large": ("mobilenet_v3_large", "MobileNetV3Large", None, None),
    "mobilenet_v3_small": ("mobilenet_v3_small", "MobileNetV3Small", None, None),
    **{f"efficientnet_b{i}": (f"efficientnet_b{i}", f"EfficientNetB{i}", None, None) for i in range(8)},
    **{f"efficientnet_v2_{s}": (f"efficientnet_v2_{s}", f"EfficientNetV2{s.upper()}", None, None) for s in "sml"},
    **{f"efficientnet_v2_b{i}": (None, f"EfficientNetV2B{i}", None, None) for i in range(4)},
    "densenet121": ("densenet121", "DenseNet121", None, "densenet121"),
    "densenet161": ("densenet161", None, None, "densenet161"),
    "densenet169": ("densenet169", "DenseNet169", None, "densenet169"),
    "densenet201": ("densenet201", "DenseNet201", None, "densenet201"),
    "vgg11": ("vgg11", None, None, "vgg11"), "vgg11_bn": ("vgg11_bn", None, None, "vgg11_bn"),
    "vgg13": ("vgg13", None, None, "vgg13"), "vgg13_bn": ("vgg13_bn", None, None, "vgg13_bn"),
    "vgg16": ("vgg16", "VGG16", None, "vgg16"), "vgg16_bn": ("vgg16_bn", None, None, "vgg16_bn"),
    "vgg19": ("vgg19", "VGG19", None, "vgg19"), "vgg19_bn": ("vgg19_bn", None, None, "vgg19_bn"),
    "alexnet": ("alexnet", None, None, "alexnet"),
    "inception_v3": ("inception_v3", "InceptionV3", None, "inceptionv3"),
    "squeezenet1_0": ("squeezenet1_0", None, None, "squeezenet1.0"),
    "squeezenet1_1": ("squeezenet1_1", None, None, "squeezenet1.1"),
    **{f"convnext_{s}": (f"convnext_{s}", f"ConvNeXt{s.title()}", None, None) for s in ("tiny", "small", "base", "large")},
    "convnext_xlarge": (None, "ConvNeXtXLarge", None, None),
    "xception": (None, "Xception", None, None),
    "inception_resnet_v2": (None, "InceptionResNetV2", None, None),
    "nasnet_large": (None, "NASNetLarge", None, None),
    "nasnet_mobile": (None, "NASNetMobile", None, None),
    **{f"mobilenet{w}": (None, None, None, f"mobilenet{w}") for w in ("0.75", "0.5", "0.25")},
    **{f"mobilenetv2_{w}": (None, None, None, f"mobilenetv2_{w}") for w in ("0.75", "0.5", "0.25")},
}
#: torchvision's other classification models (``torchvision.models.list_models(module=torchvision.models)``;
#: tests/pytorch/test_models.py checks this list against the installed torchvision)
_TORCHVISION_ONLY = (
    "googlenet", "maxvit_t", "mnasnet0_5", "mnasnet0_75", "mnasnet1_0", "mnasnet1_3",
    *(f"regnet_{k}_{s}" for k in "xy" for s in ("400mf", "800mf", "1_6gf", "3_2gf", "8gf", "16gf", "32gf")),
    "regnet_y_128gf", "resnext50_32x4d", "resnext101_32x8d", "resnext101_64x4d",
    "shufflenet_v2_x0_5", "shufflenet_v2_x1_0", "shufflenet_v2_x1_5", "shufflenet_v2_x2_0",
    "swin_t", "swin_s", "swin_b", "swin_v2_t", "swin_v2_s", "swin_v2_b",
    "vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32", "vit_h_14", "wide_resnet50_2", "wide_resnet101_2",
)

#: the video classifiers of ``crossdali.video.models`` (PyTorch), by the names its ``--arch`` takes
VIDEO_MODELS = ("small3d", "r2plus1d_18", "r3d_18", "mc3_18")

#: name -> {framework: builder name}, only the frameworks that have it
MODELS: dict[str, dict[str, str]] = {
    **{name: {f: b for f, b in zip(FRAMEWORKS, builders) if b is not None} for name, builders in _SHARED.items()},
    **{name: {"pytorch": name} for name in _TORCHVISION_ONLY},
}


def _aliases() -> dict[str, str]:
    """Keras' and Gluon's own spellings (lower case) of the models in ``MODELS``."""
    out = {}
    for name, builders in MODELS.items():
        for framework in ("tensorflow", "mxnet"):
            spelling = builders.get(framework, name).lower()
            if spelling != name and spelling not in MODELS:
                out[spelling] = name
    return out


#: another spelling -> the name in ``MODELS`` (``mobilenetv2`` -> ``mobilenet_v2``, ``resnet50_v1`` -> ``resnet50``)
ALIASES: dict[str, str] = _aliases()


class ModelNameError(ValueError):
    """An ``--arch`` name that is unknown, or not available in the framework asked for; the message
    is one line with the closest names and the command that lists them."""


def canonical_name(name: str) -> str | None:
    """The ``MODELS`` name for ``name`` (any case, or an alias), or None when it is unknown."""
    key = name.strip().lower()
    if key in MODELS:
        return key
    return ALIASES.get(key)


def models_for(framework: str) -> list[str]:
    """The names ``--arch`` takes in ``framework``."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"unknown framework {framework!r}; one of {', '.join(FRAMEWORKS)}")
    return [name for name, builders in MODELS.items() if framework in builders]


def _closest(name: str, candidates: list[str], n: int = 5) -> list[str]:
    spellings = {c: c for c in candidates}
    spellings |= {alias: target for alias, target in ALIASES.items() if target in spellings}
    found = difflib.get_close_matches(name.lower(), list(spellings), n=n * 2, cutoff=0.6)
    return list(dict.fromkeys(spellings[s] for s in found))[:n]


def builder_name(name: str, framework: str) -> str:
    """The name ``framework``'s own factory takes for ``--arch name``; ``ModelNameError`` (one line:
    the closest names and ``crossdali models``) when it is unknown or that framework lacks it."""
    known = canonical_name(name)
    listing = f"`{LIST_COMMAND} --framework {framework}` lists them"
    if known is None:
        closest = _closest(name, models_for(framework))
        hint = f"closest: {', '.join(closest)}; " if closest else ""
        raise ModelNameError(f"unknown model {name!r} ({hint}{listing})")
    builders = MODELS[known]
    if framework not in builders:
        closest = _closest(known, models_for(framework), n=3)
        hint = f"; closest in {framework}: {', '.join(closest)}" if closest else ""
        raise ModelNameError(f"model {known!r} is not available in {framework}, only in {', '.join(builders)}"
                             f"{hint} ({listing})")
    return builders[framework]


def arch_type(framework: str) -> Callable[[str], str]:
    """argparse ``type`` of ``--arch``: the ``MODELS`` name (aliases resolved), checked for
    ``framework`` without importing it; a wrong name is argparse's one-line error."""

    def arch(text: str) -> str:
        try:
            builder_name(text, framework)
        except ModelNameError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return canonical_name(text)

    arch.__name__ = "arch"  # argparse names the type in its messages
    return arch


def format_table(framework: str | None = None) -> str:
    """``crossdali models``: one line per name, with each framework's builder ('-': not available)."""
    names = models_for(framework) if framework else list(MODELS)
    columns = [framework] if framework else list(FRAMEWORKS)
    rows = [("name", *columns)] + [(n, *(MODELS[n].get(f, "-") for f in columns)) for n in names]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    aliases = sorted(a for a, n in ALIASES.items() if n in names)
    lines += textwrap.wrap(f"also accepted: {', '.join(f'{a} ({ALIASES[a]})' for a in aliases)}", width=100)
    return "\n".join(lines)
