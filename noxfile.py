"""One environment per framework (their numpy pins conflict), plus lint, demo and benchmarks.

    nox                 # the whole test suite: every framework, then the cross-framework parity check
    nox -s quick        # lint + the PyTorch environment's tests not marked slow (minutes): before every commit
    nox -s demo         # train a ResNet on the embedded sample set through DALI
    nox -s bench        # data-loader benchmark (on a GPU machine: results/latest, docs/benchmarks.md)

Every session shares one sample-data folder (.cache/data) and one parity folder (.cache/parity),
so the frameworks compare outputs of the very same JPEG bytes. A pytest run that collects no
test exits with 5, which nox treats as a failure: an empty suite never passes silently.
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

ROOT = Path(__file__).parent
DATA = ROOT / ".cache" / "data"
PARITY = ROOT / ".cache" / "parity"
#: what the tests-pytorch session's first pytest run covers (and ``quick``, without the slow tests)
PYTORCH_TESTS = ("tests/common", "tests/pytorch", "tests/video", "tests/detection", "tests/conformance")

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
# parity runs last: it compares the dumps that the tests-<framework> sessions wrote
nox.options.sessions = ["lint", "tests-pytorch", "tests-tensorflow", "tests-mxnet", "tests-jax", "parity"]


def _env() -> dict[str, str]:
    return {"CROSSDALI_DATA": str(DATA), "CROSSDALI_PARITY_DIR": str(PARITY), "CROSSDALI_CACHE": str(ROOT / ".cache"),
            "PYTHONHASHSEED": "0"}


def _install(session: nox.Session, framework: str) -> None:
    """The README's install line for this framework, exactly (tests/test_readme.py holds them equal)."""
    session.install("-r", f"requirements/{framework}.txt", "-e", ".")


def _pytest(session: nox.Session, *paths: str) -> None:
    # --durations: every CI log shows the slowest tests, to compare with pytest-timeout's 1,800 s
    args = session.posargs or [*paths, "-m", "not gpu", "--durations=15"]
    session.run("python", "-m", "pytest", *args, env=_env())


def _parity_mark(session: nox.Session, framework: str) -> None:
    """Before the tests: drop this framework's old dump and leave a marker, so that if the session
    fails the parity session names it instead of failing on a follow-on comparison error."""
    session.run("python", "-m", "crossdali.parity", "mark", str(PARITY), "--framework", framework,
                "--session", session.name, env=_env())


def _parity_dump(session: nox.Session, framework: str) -> None:
    """This framework's first train/val batches (CPU mode) for the final ``parity`` session."""
    session.run("python", "-m", "crossdali.parity", "dump", "--framework", framework, "--out", str(PARITY), env=_env())


@nox.session(name="tests-pytorch")
def tests_pytorch(session: nox.Session) -> None:
    """Common pipelines, PyTorch loaders and training (CPU); then Horovod 0.28.1 built into this same
    environment (scripts/install-horovod: about 10 min on 2 cores the first time, then reused),
    horovodrun --gloo and torchrun jobs checked against one process, the Dockerfiles and the README.

    One environment for both parts: torch's CUDA wheels take 5.5 GB, and a second copy (Horovod had a
    session of its own) filled the CI machine's disk on 2026-11-26. Arguments after ``--`` replace
    both pytest runs with one run of exactly those (no Horovod build: the launcher tests skip, with
    the reason, until a full run has built it)."""
    _install(session, "pytorch")
    _parity_mark(session, "pytorch")
    _pytest(session, *PYTORCH_TESTS)
    _parity_dump(session, "pytorch")
    if session.posargs:
        return
    session.install("-r", "requirements/lint.txt")  # hadolint, for tests/test_docker.py
    # --cpu: Gloo only (no GPU here); one CUDA arch for the kernels a CUDA build of torch pulls in
    session.run("bash", "scripts/install-horovod", "--pytorch", "--cpu", external=True,
                env={"PYTHON": str(Path(session.bin) / "python"), "HOROVOD_BUILD_CUDA_CC_LIST": "90"})
    session.run("python", "-m", "pytest", "tests/launch", "tests/test_docker.py", "tests/test_readme.py",
                "-m", "not gpu", env={**_env(), "CROSSDALI_REQUIRE_HOROVOD": "1"})


@nox.session(name="tests-tensorflow")
def tests_tensorflow(session: nox.Session) -> None:
    """TensorFlow DALIDataset wrapper, native tf.data baseline, Keras training (CPU)."""
    _install(session, "tensorflow")
    # the plugin compiles against the TensorFlow just installed: no build isolation
    session.install("--no-build-isolation", "-r", "requirements/tensorflow-plugin.txt")
    _parity_mark(session, "tensorflow")
    _pytest(session, "tests/tensorflow", "tests/detection/test_tf_detection.py", "tests/video/test_tensorflow_video.py",
            "tests/conformance", "tests/common/test_same_flags.py", "tests/common/test_public_api.py")
    _parity_dump(session, "tensorflow")


@nox.session(name="tests-mxnet")
def tests_mxnet(session: nox.Session) -> None:
    """MXNet DataIter over DALI (DALI 2.x has no MXNet plugin), native ImageRecordIter, Gluon
    training, dist_sync workers (CPU). Its own env: mxnet 1.9.1 needs numpy 1.23."""
    _install(session, "mxnet")
    _parity_mark(session, "mxnet")
    _pytest(session, "tests/mxnet", "tests/conformance", "tests/common/test_same_flags.py", "tests/common/test_public_api.py")
    _parity_dump(session, "mxnet")


@nox.session(name="tests-jax")
def tests_jax(session: nox.Session) -> None:
    """JAX loaders on DALI's JAX iterator (CPU pipelines: it takes them), flax/optax training (CPU jaxlib)."""
    _install(session, "jax")
    _parity_mark(session, "jax")
    _pytest(session, "tests/jax", "tests/conformance/test_seed_order.py", "tests/conformance/test_scripts_refuse_bad_data.py",
            "tests/common/test_same_flags.py", "tests/common/test_public_api.py")
    _parity_dump(session, "jax")


@nox.session
def parity(session: nox.Session) -> None:
    """Bit-exact comparison of every framework's dump (fails unless PyTorch, TensorFlow, MXNet and JAX all dumped)."""
    session.install("-r", "requirements/parity.txt")
    session.install("--no-deps", "-e", ".")
    _pytest(session, "tests/parity")
    session.run("python", "-m", "crossdali.parity", "compare", str(PARITY), "--min-frameworks", "4",
                "--expect", "pytorch,tensorflow,mxnet,jax", env=_env())


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the package, tests and scripts; hadolint over the Dockerfiles."""
    session.install("-r", "requirements/lint.txt")
    session.run("ruff", "check", "crossdali", "tests", "noxfile.py", "benchmarks")
    session.run("hadolint", *sorted(str(p) for p in ROOT.glob("docker/*/Dockerfile")))


@nox.session(venv_backend="none")
def quick(session: nox.Session) -> None:
    """The contributor's lane: ruff, then the tests of the PyTorch environment that are neither ``slow`` nor
    ``gpu`` (a few minutes on 2 cores). It runs in the ``lint`` and ``tests-pytorch`` environments, created first
    (``--install-only``) where missing, so it installs nothing twice; arguments after ``--`` go to pytest."""
    lint_bin, torch_bin = ROOT / ".nox" / "lint" / "bin", ROOT / ".nox" / "tests-pytorch" / "bin"
    if not (lint_bin / "ruff").exists() or not (torch_bin / "python").exists():
        session.run("python3", "-m", "nox", "-s", "lint", "tests-pytorch", "--install-only", external=True)
    session.run(str(lint_bin / "ruff"), "check", "crossdali", "tests", "noxfile.py", "benchmarks", external=True)
    session.run(str(torch_bin / "python"), "-m", "pytest", *PYTORCH_TESTS, "tests/test_readme.py", "-m",
                "not slow and not gpu", "-q", "--durations=10", *session.posargs, env=_env(), external=True)


@nox.session
def demo(session: nox.Session) -> None:
    """Build the sample set if missing and train a ResNet on it through DALI (GPU if present)."""
    _install(session, "pytorch")
    args = session.posargs or ["--arch", "resnet18", "--crop-size", "128", "-b", "32", "--epochs", "4",
                               "--lr", "0.2", "--lr-warmup-epochs", "1", "--output-dir", "runs/demo"]
    session.run("python", "-m", "crossdali.pytorch.train_classification", *args,
                env={"CROSSDALI_DATA": os.environ.get("CROSSDALI_DATA", str(DATA))})


@nox.session
def bench(session: nox.Session) -> None:
    """Data-loader throughput of every PyTorch backend on the same files (JSON + PNG in results/latest/)."""
    _install(session, "pytorch")
    session.run("python", "-m", "benchmarks.classification_loaders", *session.posargs, env=_env())
