"""How a training script starts and ends, the same for every framework.

``run(main, get_args_parser())`` parses the command line and calls ``main(args)``. A user's mistake
(a bad path, flag value or file: ``DataError``, ``UsageError``) prints one line naming the thing and
the fix and exits 2; so does a dependency of crossdali missing from the environment (an incomplete
install: ``missing_dependency_line``), and an output that cannot be written (``WriteError``, or an ``OSError`` such
as a full disk or a read-only folder on a named file); a stop asked for by SIGTERM/SIGINT (``TrainingStopped``) prints where the
checkpoint is and exits 128 + the signal number, as a shell reports a signal; anything else is a
bug and keeps its traceback. ``--debug`` keeps tracebacks for everything.
"""

from __future__ import annotations

import argparse
import errno
import logging
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from crossdali.common.distributed import detect_distributed
from crossdali.common.errors import DataError, UsageError, WriteError

__all__ = ["DEPENDENCIES", "TrainingStopped", "USER_ERRORS", "missing_dependency", "missing_dependency_line", "run",
           "configure_logging"]


class TrainingStopped(Exception):
    """Training stopped on a signal after saving a checkpoint it can resume from."""

    def __init__(self, message: str, *, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


#: Exceptions that mean "the user gave something wrong" (or "an output could not be written"): one line, exit 2.
USER_ERRORS: tuple[type[BaseException], ...] = (DataError, UsageError, WriteError)
#: An ``OSError`` with one of these on a named file is the machine's state, not a bug: one line, exit 2.
_FILE_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EFBIG, errno.EDQUOT,
                          errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG})


#: Import name (or dotted prefix) -> the distribution to install, for what crossdali imports itself
#: (pyproject.toml's dependencies and the extras its scripts reach). A ``ModuleNotFoundError`` for one of these is
#: an incomplete install, said in one line; any other is a bug and keeps its traceback.
DEPENDENCIES = {"nvidia.dali.plugin.tf": "nvidia-dali-tf-plugin-cuda130", "nvidia": "nvidia-dali-cuda130",
                "numpy": "numpy", "PIL": "pillow", "tfrecord": "tfrecord", "crc32c": "crc32c", "tqdm": "tqdm",
                "simplejpeg": "simplejpeg", "boto3": "boto3", "av": "av", "matplotlib": "matplotlib",
                "skimage": "scikit-image", "pycocotools": "pycocotools"}
_FRAMEWORKS = ("pytorch", "tensorflow", "jax", "mxnet")


def missing_dependency(error: ImportError) -> str | None:
    """The distribution to install for ``error`` where it is a missing dependency of crossdali, else None.
    The module's name comes from the error, or from its message where a worker process raised it. Only a module
    not found counts: an ``ImportError`` naming a dependency (a name it lacks) is a version mismatch, not this."""
    if not isinstance(error, ModuleNotFoundError):
        return None
    name = error.name
    if not name and (found := re.search(r"No module named '([^']+)'", str(error))):
        name = found.group(1)
    parts = (name or "").split(".")
    for n in range(len(parts), 0, -1):  # the longest dotted prefix that names a dependency
        if (package := DEPENDENCIES.get(".".join(parts[:n]))) is not None:
            return package
    return None


def missing_dependency_line(error: ImportError, *, prog: str, where: str = "") -> str | None:
    """The one line for a missing dependency: crossdali's own ``ImportError`` (its message names the package and
    ``pip install``), or a missing module of ``DEPENDENCIES`` with ``pip install PACKAGE`` and the requirements file
    of the framework that ``prog`` or ``where`` (a module name) names. None for any other error (a bug)."""
    if "pip install" in str(error):
        return f"{prog}: error: {error}"
    package = missing_dependency(error)
    if package is None:
        return None
    framework = next((f for f in _FRAMEWORKS if f in f"{where} {prog}"), "<framework>")
    return (f"{prog}: error: the Python package {package} is not installed here, and crossdali needs it (`pip install "
            f"{package}`; `pip install -r requirements/{framework}.txt -e .` from the source checkout installs every "
            "dependency)")


def configure_logging(*, is_main: bool, debug: bool = False) -> None:
    """INFO on rank 0 and WARNING elsewhere (other ranks are quiet, not patched), DEBUG with --debug."""
    level = logging.DEBUG if debug else logging.INFO if is_main else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")


def _discard_unstarted_runs() -> None:
    """A run stopped by a user's mistake before its first checkpoint or epoch leaves no folder behind."""
    from crossdali.common.scripts.metrics import discard_unstarted_runs

    for path in discard_unstarted_runs():
        logging.getLogger(__name__).debug("removed %s: the run stopped before its first checkpoint", path)


def _prefix(prog: str) -> str:
    dist = detect_distributed()
    return f"{prog} [rank {dist.rank}]" if dist.is_distributed else prog


def run(main: Callable[[argparse.Namespace], Any], parser: argparse.ArgumentParser,
        argv: Sequence[str] | None = None) -> None:
    """Parse ``argv`` (default: the command line), run ``main`` and exit as the module docstring says."""
    args = parser.parse_args(argv)
    debug = bool(getattr(args, "debug", False))
    try:
        main(args)
    except USER_ERRORS as e:
        _discard_unstarted_runs()
        if debug:
            raise
        print(f"{_prefix(parser.prog)}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except ImportError as e:
        line = missing_dependency_line(e, prog=_prefix(parser.prog), where=getattr(main, "__module__", ""))
        if debug or line is None:
            raise
        _discard_unstarted_runs()
        print(line, file=sys.stderr)
        raise SystemExit(2) from None
    except OSError as e:
        if debug or e.filename is None or e.errno not in _FILE_ERRNOS:
            raise
        _discard_unstarted_runs()
        print(f"{_prefix(parser.prog)}: error: {e.filename}: {e.strerror}", file=sys.stderr)
        raise SystemExit(2) from None
    except TrainingStopped as e:
        print(f"{_prefix(parser.prog)}: {e}", file=sys.stderr)
        raise SystemExit(128 + e.signum) from None
    except KeyboardInterrupt:  # a second Ctrl-C: stop now, without a checkpoint
        if debug:
            raise
        print(f"{_prefix(parser.prog)}: interrupted (no checkpoint written for the current step)", file=sys.stderr)
        raise SystemExit(130) from None
