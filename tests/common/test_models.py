"""One model vocabulary (``crossdali.common.models``): the same ``--arch`` names in every framework,
checked by the parsers without importing a framework, and a wrong name answered in one line with
the closest names and the command that lists them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from crossdali.common.models import ALIASES, FRAMEWORKS, MODELS, ModelNameError, builder_name, canonical_name, models_for

ROOT = Path(__file__).resolve().parents[2]


def test_the_shared_names_mean_the_same_model_everywhere():
    assert builder_name("resnet50", "pytorch") == "resnet50"
    assert builder_name("resnet50", "tensorflow") == "ResNet50"
    assert builder_name("resnet50", "jax") == "resnet50"
    assert builder_name("resnet50", "mxnet") == "resnet50_v1"
    assert builder_name("mobilenet_v2", "tensorflow") == "MobileNetV2"
    assert builder_name("mobilenet_v2", "mxnet") == "mobilenetv2_1.0"
    assert builder_name("efficientnet_b0", "tensorflow") == "EfficientNetB0"
    for framework in FRAMEWORKS:
        assert "resnet50" in models_for(framework)
    assert list(MODELS["small_cnn"]) == ["pytorch", "tensorflow", "jax"]


@pytest.mark.parametrize("alias, name", [("mobilenetv2", "mobilenet_v2"), ("efficientnetb0", "efficientnet_b0"),
                                         ("ResNet50_v1", "resnet50"), ("squeezenet1.1", "squeezenet1_1"),
                                         ("MobileNetV3Small", "mobilenet_v3_small")])
def test_keras_and_gluon_spellings_are_aliases(alias, name):
    assert canonical_name(alias) == name
    assert not set(ALIASES) & set(MODELS)  # an alias never hides a name


def test_an_unknown_name_gives_the_closest_and_the_list_command():
    with pytest.raises(ModelNameError) as e:
        builder_name("resnet5", "pytorch")
    message = str(e.value)
    assert message.startswith("unknown model 'resnet5' (closest: resnet50")
    assert message.count(",") <= 4 and "`crossdali models --framework pytorch` lists them" in message
    assert "\n" not in message


def test_a_name_another_framework_has_says_which():
    with pytest.raises(ModelNameError, match=r"model 'resnet18' is not available in tensorflow, only in pytorch, jax, "
                                             r"mxnet; closest in tensorflow: .*resnet50"):
        builder_name("resnet18", "tensorflow")
    with pytest.raises(ModelNameError, match=r"'efficientnet_b0' is not available in jax, only in pytorch, tensorflow"):
        builder_name("efficientnetb0", "jax")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=dict(os.environ))


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("arch, accepted", [("resnet50", True), ("mobilenetv2", None), ("resnet5", False),
                                            ("vit_b_16", None)])
def test_every_parser_checks_arch_without_importing_a_framework(framework, arch, accepted):
    """The classification parsers of all four frameworks, in a process with none of them imported."""
    code = ("import sys\nfrom crossdali.common.scripts.script_parsers import PARSERS\n"
            f"parser = PARSERS[('classification', {framework!r})]()\nparser.prog = 'train'\n"
            "try:\n    print('ARCH', parser.parse_args(sys.argv[1:]).arch)\nexcept SystemExit as e:\n    print('EXIT', e.code)\n"
            "print('HEAVY', sorted(m for m in ('torch', 'tensorflow', 'mxnet', 'jax', 'flax', 'nvidia.dali') "
            "if m in sys.modules))")
    proc = _run("-c", code, "--arch", arch)
    assert "HEAVY []" in proc.stdout, proc.stdout
    if accepted is None:
        accepted = (canonical_name(arch) in models_for(framework))
    if accepted:
        assert f"ARCH {canonical_name(arch)}" in proc.stdout, proc.stdout + proc.stderr
        assert proc.stderr == ""
    else:
        assert "EXIT 2" in proc.stdout
        err = proc.stderr.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("train: error: argument --arch: "), err
        assert f"`crossdali models --framework {framework}`" in err[0]


def test_models_command_lists_the_table():
    proc = _run("-m", "crossdali", "models")
    assert proc.returncode == 0, proc.stderr
    header, *rows = proc.stdout.splitlines()
    assert header.split() == ["name", *FRAMEWORKS]
    resnet50 = next(r for r in rows if r.startswith("resnet50 "))
    assert resnet50.split() == ["resnet50", "resnet50", "ResNet50", "resnet50", "resnet50_v1"]
    proc = _run("-m", "crossdali", "models", "--framework", "jax")
    names = [line.split()[0] for line in proc.stdout.splitlines()[1:] if not line.startswith("also")]
    assert names == models_for("jax")


@pytest.mark.parametrize("task", ["video", "detection"])
def test_the_pytorch_only_tasks_check_arch_without_importing_torch(task):
    code = ("import sys\nfrom crossdali.common.scripts.script_parsers import PARSERS\n"
            f"parser = PARSERS[({task!r}, 'pytorch')]()\nparser.prog = 'train'\n"
            "try:\n    parser.parse_args(['--arch', 'nonet'])\nexcept SystemExit as e:\n    print('EXIT', e.code)\n"
            "print('HEAVY', sorted(m for m in ('torch', 'torchvision') if m in sys.modules))")
    proc = _run("-c", code)
    assert "EXIT 2" in proc.stdout and "HEAVY []" in proc.stdout, proc.stdout + proc.stderr
    assert "argument --arch: invalid choice: 'nonet'" in proc.stderr
