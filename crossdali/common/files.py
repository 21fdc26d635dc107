"""Files written whole or not at all: checkpoints, check reports and exclusion lists.

``write_atomically`` writes to a temporary file in the destination's folder and renames it over the
destination, so a failed write (a full disk, a file-size limit, a read-only folder, a process
killed mid-write) leaves the previous file as it was, loadable. A failure raises ``WriteError``,
whose message names the file and the cause in one line.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from crossdali.common.errors import WriteError

__all__ = ["WriteError", "write_atomically", "write_text_atomically"]


def write_atomically(path: str | os.PathLike, write: Callable[[BinaryIO], None], *, what: str = "file") -> Path:
    """Call ``write(f)`` on a temporary file beside ``path``, flush it to disk, then rename it to ``path``.

    Args:
        path: the file to (re)place.
        write: writes the whole content to the binary file object it is given.
        what: the kind of file, for the error message ("checkpoint", "report").
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        kept = f"; the previous {path.name} is unchanged" if path.is_file() else ""
        raise WriteError(f"cannot write {what} {path}: {e.strerror or e}{kept}") from e
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # the folder itself is unusable: nothing was left there
            pass
    return path


def write_text_atomically(path: str | os.PathLike, text: str, *, what: str = "file") -> Path:
    """``write_atomically`` for UTF-8 text."""
    return write_atomically(path, lambda f: f.write(text.encode("utf-8")), what=what)
