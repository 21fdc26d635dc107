"""The ``crossdali`` command: help without heavy imports, user mistakes as one line and exit 2, and
``train`` reaching the real scripts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _crossdali(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, **env}
    return subprocess.run([sys.executable, "-m", "crossdali", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env=environ)


@pytest.mark.parametrize("args", [(), ("--help",), ("train", "--help"), ("bench", "--help"), ("plot", "--help")])
def test_help_lists_commands_and_imports_no_framework(args):
    code = ("import sys\nfrom crossdali.cli import main\ntry:\n    main(list(sys.argv[1:]))\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in ('torch', 'tensorflow', 'mxnet', 'jax', 'nvidia.dali') if m in sys.modules)\n"
            "print('HEAVY', heavy)")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout, proc.stdout  # --help stays fast: no framework, no DALI imported
    if not args:
        for command in ("info", "make-data", "check", "train", "plot", "bench", "models"):
            assert command in proc.stdout
    assert "``" not in proc.stdout  # plain text, not reST


@pytest.mark.parametrize("args, message", [
    (("train", "segmentation"), "unknown task 'segmentation'; choose one of classification, detection"),
    (("train", "classification", "--framework", "caffe"), "--framework 'caffe' is not one of pytorch"),
    (("train", "detection", "--framework", "mxnet"), "no mxnet script; this task exists for pytorch"),
    (("bench", "nope"), "unknown benchmark 'nope'"),
    (("plot", "docs"), "crossdali plot: docs has no metrics.jsonl; pass a run folder"),
    (("train", "--framework", "pytorch"), "the task comes first, one of classification, detection, optical-flow, "
                                          "video (e.g. crossdali train classification --framework pytorch)"),
])
def test_user_mistakes_are_one_line_and_exit_2(args, message):
    proc = _crossdali(*args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_info_says_what_auto_picks():
    proc = _crossdali("info")
    assert proc.returncode == 0, proc.stderr
    assert "DALI            2.4" in proc.stdout
    have_gpu = "GPUs: none visible" not in proc.stdout
    assert f"--data-backend auto: {'dali-gpu' if have_gpu else 'dali-cpu'}" in proc.stdout


def test_train_forwards_to_the_script(tmp_path):
    """`crossdali train classification` is the PyTorch script: its own --help, with its own flags."""
    pytest.importorskip("torch")
    proc = _crossdali("train", "classification", "--framework", "pytorch", "--help")
    assert proc.returncode == 0, proc.stderr
    options = proc.stdout.split("options:", 1)[1]
    assert "--data-backend" in options and "--framework" not in options  # the script's flags, not the CLI's
    assert proc.stdout.startswith("usage: crossdali train classification --framework pytorch")


_SCRIPT_KEYS = [("classification", "pytorch", "torch"), ("classification", "tensorflow", "tensorflow"),
                ("classification", "jax", "jax"), ("classification", "mxnet", "mxnet"), ("detection", "pytorch", "torch"),
                ("video", "pytorch", "torch")]


@pytest.mark.parametrize("task, framework, module", _SCRIPT_KEYS)
@pytest.mark.parametrize("argv, code, expect", [
    (("--help",), 0, "usage: crossdali train {task} --framework {framework}"),
    (("--data", "/nonexistent/photos"), 2, "--data /nonexistent/photos does not exist"),
    (("--epochs", "many"), 2, "argument --epochs: invalid positive_int value: 'many'"),
])
def test_train_answers_help_and_mistakes_before_the_framework_loads(task, framework, module, argv, code, expect):
    """Issue: "--help under 1 s with lazy imports; argument and data errors before heavy imports"."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed in this session")
    run = ("import sys\nfrom crossdali.cli import entry_point\nsys.argv[0] = 'crossdali'\ntry:\n    entry_point()\n"
           "except SystemExit as e:\n    code = e.code\n"
           "heavy = sorted(m for m in ('torch', 'tensorflow', 'mxnet', 'jax', 'nvidia.dali') if m in sys.modules)\n"
           "print('HEAVY', heavy, 'CODE', code)")
    proc = subprocess.run([sys.executable, "-c", run, "train", task, "--framework", framework, *argv], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env=dict(os.environ))
    assert "HEAVY [] CODE" in proc.stdout, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().endswith(f"CODE {code}"), proc.stdout
    assert expect.format(task=task, framework=framework) in proc.stdout + proc.stderr
    if code:
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("script, task, framework", [
    ("crossdali.pytorch.train_classification", "classification", "pytorch"),
    ("crossdali.detection_ssd.train", "detection", "pytorch"),
    ("crossdali.video.train", "video", "pytorch"),
    ("crossdali.tensorflow.train_classification", "classification", "tensorflow"),
    ("crossdali.jax.train_classification", "classification", "jax"),
    ("crossdali.mxnet.train_classification", "classification", "mxnet"),
])
def test_each_script_parses_with_the_parser_crossdali_train_checks_first(script, task, framework):
    """The CLI's early parse and the script's own are the same flags, defaults and help."""
    import importlib

    from crossdali.common.scripts.script_parsers import PARSERS

    pytest.importorskip({"pytorch": "torch"}.get(framework, framework))
    ours, theirs = PARSERS[(task, framework)](), importlib.import_module(script).get_args_parser()
    assert ours.format_help() == theirs.format_help()
    assert vars(ours.parse_args([])) == vars(theirs.parse_args([]))
