"""A quiet start: importing crossdali's TensorFlow side prints none of TensorFlow's start-up banners
(absl's pre-init notice, oneDNN's, the CPU-feature one), unless --debug asks for everything."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("tensorflow")

from crossdali.tensorflow.quiet import BANNERS  # noqa: E402

CODE = "import crossdali.tensorflow, tensorflow as tf; tf.constant(1.0) + 1; print('READY')"


def _start(*args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "CROSSDALI_DEBUG")}
    return subprocess.run([sys.executable, "-c", CODE, *args], capture_output=True, text=True, timeout=300,
                          env={**environ, **env})


def test_no_banner_before_the_first_line():
    proc = _start()
    assert proc.returncode == 0 and "READY" in proc.stdout, proc.stderr
    assert proc.stderr.strip() == "", proc.stderr
    assert not any(b in proc.stderr for b in BANNERS)


def test_debug_and_the_users_own_setting_are_respected():
    quiet, debug = _start(), _start("--debug")
    assert debug.returncode == 0, debug.stderr
    assert len(debug.stderr) >= len(quiet.stderr)  # --debug hides nothing (what TensorFlow prints varies by build)
    proc = subprocess.run([sys.executable, "-c", "import os, crossdali.tensorflow; print(os.environ['TF_CPP_MIN_LOG_LEVEL'])"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"})
    assert proc.stdout.strip() == "0", proc.stderr
