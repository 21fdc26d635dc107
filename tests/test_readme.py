"""The README's install lines are the ones the test sessions run: a user who follows the README gets
the environment CI tests (issue: "install for your own use (each framework) in one line each,
tested by a test that follows the README")."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SESSIONS = {"pytorch": "tests-pytorch", "tensorflow": "tests-tensorflow", "jax": "tests-jax", "mxnet": "tests-mxnet"}
TEST_TOOLS = {"requirements/lint.txt", "requirements/nox.txt"}
# Horovod is optional: scripts/install-horovod installs it (and this file) where a user wants it,
# and README says so in its own line; tests-pytorch runs that script after its unit tests.
OPTIONAL = {"requirements/horovod.txt"}


def readme_install_lines() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README's Install section has no ```bash block"
    return [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]


def pip_installs(line: str) -> tuple[set[tuple[str, tuple[str, ...]]], bool]:
    """(requirement files with pip flags, whether the checkout itself is installed) of one line."""
    files, editable = set(), False
    for command in line.split("&&"):
        tokens = shlex.split(command)
        assert tokens[:2] == ["pip", "install"], f"README install line runs something else: {command!r}"
        flags = tuple(sorted(t for t in tokens if t in ("--no-build-isolation", "--no-deps")))
        files |= {(tokens[i + 1], flags) for i, t in enumerate(tokens) if t == "-r"}
        editable |= any(tokens[i:i + 2] == ["-e", "."] for i in range(len(tokens)))
    return files, editable


@pytest.mark.parametrize("framework", SESSIONS)
def test_readme_installs_what_the_framework_session_installs(framework, nox_installs):
    expected = {(f, flags) for f, flags in nox_installs(SESSIONS[framework]) if f not in TEST_TOOLS | OPTIONAL}
    lines = [line for line in readme_install_lines() if f"requirements/{framework}.txt" in line]
    assert len(lines) == 1, f"README should have one install line for {framework}, found {lines}"
    files, editable = pip_installs(lines[0])
    assert files == expected, f"README installs {sorted(files)} for {framework}, the tests install {sorted(expected)}"
    assert editable, f"README's {framework} line must install the checkout (-e .), as the session does"
    for file, _ in files:
        assert (ROOT / file).is_file(), f"README installs {file}, which does not exist"


def test_sessions_install_the_checkout_like_the_readme():
    """The sessions' `_install` is README's `pip install -r requirements/<framework>.txt -e .`."""
    assert 'session.install("-r", f"requirements/{framework}.txt", "-e", ".")' in (ROOT / "noxfile.py").read_text()


def test_drift_is_caught(nox_installs):
    """The check itself: a line that forgets the TF plugin step does not match the TF session."""
    files, editable = pip_installs("pip install -r requirements/tensorflow.txt -e .")
    assert editable and files != {(f, fl) for f, fl in nox_installs("tests-tensorflow") if f not in TEST_TOOLS}
