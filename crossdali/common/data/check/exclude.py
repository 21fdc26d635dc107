"""The exclusion list: samples to leave out of training, as ``crossdali check`` writes them.

One sample id per line, ``#`` starts a comment (``\\t#`` after an id). Ids are paths relative to
the dataset folder that was checked (``train/dog/x.jpg``), matched against the loaders' absolute
paths by their trailing path components, so the list survives a dataset moved to another mount;
a record is ``<record file>#<n>`` (its n-th line in the index, from 0); a whole record file is
its path alone.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path, PurePath

from crossdali.common.errors import DataError

log = logging.getLogger(__name__)

__all__ = ["Exclusions", "apply_exclusions", "load_exclusions", "format_exclusions"]

_RECORD_ID = re.compile(r"^(?P<file>.+)#(?P<n>\d+)$")


def _parts(path: str | os.PathLike) -> tuple[str, ...]:
    return tuple(p for p in PurePath(os.path.normpath(str(path))).parts if p not in ("/", ""))


class Exclusions:
    """A set of sample ids with path-suffix matching (see the module docstring)."""

    def __init__(self, ids: Iterable[str] = (), *, origin: str = "") -> None:
        self.ids = sorted({i.strip() for i in ids if i.strip()})
        self.origin = origin
        self._files: dict[str, list[tuple[str, ...]]] = {}
        self._records: dict[str, list[tuple[tuple[str, ...], int]]] = {}
        for i in self.ids:
            m = _RECORD_ID.match(i)
            if m:
                parts = _parts(m["file"])
                self._records.setdefault(parts[-1], []).append((parts, int(m["n"])))
            parts = _parts(i)  # a file name may end in #<digits> too: keep it as a file id as well
            if parts:
                self._files.setdefault(parts[-1], []).append(parts)

    def __bool__(self) -> bool:
        return bool(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return f"Exclusions({len(self.ids)} ids{', from ' + self.origin if self.origin else ''})"

    def excludes_file(self, path: str | os.PathLike) -> bool:
        parts = _parts(path)
        return bool(parts) and any(parts[-len(c):] == c for c in self._files.get(parts[-1], ()))

    def excluded_records(self, record_file: str | os.PathLike) -> set[int]:
        """Index positions excluded in ``record_file`` (all of them are excluded if the file is)."""
        parts = _parts(record_file)
        return {n for c, n in self._records.get(parts[-1], ()) if parts[-len(c):] == c} if parts else set()


def load_exclusions(exclude: str | os.PathLike | Iterable[str] | Exclusions | None) -> Exclusions:
    """``exclude`` as ``Exclusions``: a path to an exclusion list, ids, or ``None`` (nothing)."""
    if exclude is None:
        return Exclusions()
    if isinstance(exclude, Exclusions):
        return exclude
    if isinstance(exclude, (str, os.PathLike)):
        path = Path(exclude)
        if not path.is_file():
            raise DataError(f"exclusion list {path} does not exist; pass the exclude.txt that `crossdali check` "
                            "wrote (or a file with one sample id per line)")
        ids = []
        for line in path.read_text(encoding="utf-8").splitlines():
            sample = line.split("\t#", 1)[0]
            if sample.strip() and not sample.lstrip().startswith("#"):
                ids.append(sample)
        return Exclusions(ids, origin=str(path))
    return Exclusions(list(exclude))


def format_exclusions(rows: Iterable[tuple[str, str]], *, header: str = "") -> str:
    """The text of an exclusion list from ``(sample id, reason)`` rows."""
    lines = [f"# {line}" for line in header.splitlines()] if header else []
    lines += [f"{sample}\t# {' '.join(reason.split())}" for sample, reason in rows]
    return "\n".join(lines) + "\n"


def apply_exclusions(files: list[str], labels: list[int], exclusions: Exclusions,
                     where: str) -> tuple[list[str], list[int]]:
    """``files`` and their ``labels`` less those ``exclusions`` names, with one warning saying how many went;
    a ``DataError`` if none is left. ``where``: the dataset or list they came from, for the messages."""
    if not exclusions:
        return files, labels
    keep = [i for i, f in enumerate(files) if not exclusions.excludes_file(f)]
    n = len(files) - len(keep)
    log.warning("%s: excluded %d of %d samples listed in %s", where, n, len(files), exclusions.origin or "exclude=")
    if not keep:
        raise DataError(f"{where}: the exclusion list {exclusions.origin or ''} excludes every sample; nothing to train on")
    return [files[i] for i in keep], [labels[i] for i in keep]
