"""The Dockerfiles: hadolint-clean, and installing exactly the pinned requirement files that the
tests of their environment install (no Docker daemon is needed for either check).

"No drift" means: the ``-r requirements/...`` files a Dockerfile's ``pip install`` steps use (plus
requirements/horovod.txt, which scripts/install-horovod installs) are the files the noxfile's test
sessions for that framework install, with the same flags (``--no-build-isolation`` for the
TensorFlow plugin); a bare package on a ``pip install`` line is an error unless listed in
``ALLOWED_EXTRAS`` with the pin it must agree with.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILES = sorted((ROOT / "docker").glob("*/Dockerfile"))
# Dockerfile -> the nox sessions whose installs it must reproduce.
SESSIONS = {
    "pytorch": ["tests-pytorch"],
    "tensorflow": ["tests-tensorflow"],
    "mxnet": ["tests-mxnet"],
}
# Packages a Dockerfile may install by name, and the requirement pin whose version they must carry:
# the GPU build of TensorFlow replaces tensorflow-cpu, at the very version the tests use.
ALLOWED_EXTRAS = {"tensorflow[and-cuda]": ("tensorflow.txt", "tensorflow-cpu")}
HOROVOD_SCRIPT = "scripts/install-horovod"
# Test tools a session installs beside the environment (hadolint for this file): not in images.
TEST_TOOLS = {"requirements/lint.txt", "requirements/nox.txt"}


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    lines, current = [], ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued RUN
        current += " " + line
        if current.endswith("\\"):
            current = current[:-1]
            continue
        lines.append(current.strip())
        current = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def _commands(shell: str) -> list[list[str]]:
    """A RUN line's shell commands (split at ``&&``, ``||``, ``;``, ``|``), each as argv tokens."""
    lexer = shlex.shlex(shell, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in ("&&", "||", ";", "|"):
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def _requirement_pin(file: str, package: str) -> str:
    for line in (ROOT / "requirements" / file).read_text().splitlines():
        m = re.fullmatch(rf"{re.escape(package)}==(\S+)", line.strip())
        if m:
            return m.group(1)
    raise AssertionError(f"requirements/{file} has no {package}== pin")


def docker_installs(dockerfile: Path) -> tuple[set[tuple[str, tuple[str, ...]]], list[str]]:
    """The requirement files (with pip flags) a Dockerfile installs, and bare packages it names."""
    files: set[tuple[str, tuple[str, ...]]] = set()
    extras: list[str] = []
    copied = False
    for instruction, args in _instructions(dockerfile):
        if instruction == "COPY" and args.split()[0].rstrip("/") == "requirements":
            copied = True
        if instruction != "RUN":
            continue
        for tokens in _commands(args):
            command = " ".join(tokens)
            if HOROVOD_SCRIPT in command:
                files.add(("requirements/horovod.txt", ()))
            if "pip" not in tokens or "install" not in tokens or "uninstall" in tokens:
                continue
            assert copied, f"{dockerfile}: pip install before COPY requirements/: {command.strip()}"
            tokens = tokens[tokens.index("install") + 1:]
            flags = tuple(sorted(t for t in tokens if t in ("--no-build-isolation", "--no-deps")))
            i = 0
            while i < len(tokens):
                if tokens[i] == "-r":
                    files.add((tokens[i + 1], flags))
                    i += 2
                    continue
                if not tokens[i].startswith("-") and tokens[i] != ".":
                    extras.append(tokens[i])
                i += 1
    return files, extras


def test_every_framework_has_a_dockerfile():
    assert [p.parent.name for p in DOCKERFILES] == sorted(SESSIONS)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_dockerfile_installs_exactly_the_tested_requirement_files(dockerfile, nox_installs):
    framework = dockerfile.parent.name
    installed, extras = docker_installs(dockerfile)
    expected = {(file, flags) for s in SESSIONS[framework] for file, flags in nox_installs(s)
                if file not in TEST_TOOLS}
    if any(HOROVOD_SCRIPT in args for _, args in _instructions(dockerfile)):
        expected.add(("requirements/horovod.txt", ()))  # Horovod in the image, built by the same script
    assert installed == expected, (
        f"{dockerfile.relative_to(ROOT)} installs {sorted(installed)}, but its tests install {sorted(expected)}")
    for file, _ in installed:
        assert (ROOT / file).is_file(), f"{dockerfile.relative_to(ROOT)} installs {file}, which does not exist"
    for extra in extras:
        name, _, version = extra.partition("==")
        assert name in ALLOWED_EXTRAS, (
            f"{dockerfile.relative_to(ROOT)} installs {extra!r} outside the requirement files: pin it in "
            f"requirements/{framework}.txt instead")
        file, package = ALLOWED_EXTRAS[name]
        assert version == _requirement_pin(file, package), (
            f"{dockerfile.relative_to(ROOT)} installs {extra}, but requirements/{file} pins {package}=="
            f"{_requirement_pin(file, package)}")


def test_drift_check_catches_a_missing_and_an_extra_requirement(tmp_path, nox_installs):
    """The check itself: a Dockerfile that skips the plugin step and adds a package is reported."""
    bad = tmp_path / "tensorflow" / "Dockerfile"
    bad.parent.mkdir()
    bad.write_text("FROM ubuntu:24.04\nCOPY requirements/ requirements/\n"
                   "RUN pip install -r requirements/tensorflow.txt \\\n && pip install requests==2.0\n")
    installed, extras = docker_installs(bad)
    assert installed == {("requirements/tensorflow.txt", ())}
    assert installed != nox_installs("tests-tensorflow")
    assert extras == ["requests==2.0"]


def _final_stage_user(instructions: list[tuple[str, str]]) -> str | None:
    """The USER in force at the end of the image's last stage (None: the base image's, i.e. root)."""
    user = None
    for instruction, args in instructions:
        if instruction == "FROM":
            user = None  # every stage starts as the base image's user
        elif instruction == "USER":
            user = args.split()[0]
    return user


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_image_runs_as_a_non_root_user(dockerfile):
    """A container started from the image runs as an unprivileged uid, and the places a run writes
    to are writable by whatever uid `docker run --user` gives (docs/docker.md)."""
    instructions = _instructions(dockerfile)
    user = _final_stage_user(instructions)
    assert user is not None and user.split(":")[0] not in ("root", "0"), f"{dockerfile}: the image runs as root"
    runs = [args for instruction, args in instructions if instruction == "RUN"]
    assert any("useradd" in r and f"--uid {user.split(':')[0]}" in r and "chmod 1777" in r and "/runs" in r
               for r in runs), f"{dockerfile}: no useradd of uid {user} with writable /data and /runs"
    env = " ".join(args for instruction, args in instructions if instruction == "ENV")
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in env  # mpirun no longer needs the root override


def test_non_root_check_sees_a_root_image(tmp_path):
    """The check itself: USER set in the build stage only, or back to root, is still a root image."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:24.04 AS build\nUSER 1000\nFROM ubuntu:24.04\nRUN true\n")
    assert _final_stage_user(_instructions(bad)) is None
    bad.write_text("FROM ubuntu:24.04\nUSER 1000\nUSER root\n")
    assert _final_stage_user(_instructions(bad)) == "root"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint(dockerfile):
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed: pip install -r requirements/lint.txt")
    proc = subprocess.run([hadolint, "--failure-threshold", "info", str(dockerfile)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
