"""The check cache: results per file keyed by path, size and mtime, so a second start is instant.

One JSON file per checked location under ``$CROSSDALI_CACHE/check`` (default
``~/.cache/crossdali/check``), written atomically (several ranks may write the same results). A
file whose size or mtime changed is checked again; an unwritable cache only costs the speed-up.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

__all__ = ["CACHE_VERSION", "CheckCache", "default_cache_dir", "file_signature"]

log = logging.getLogger(__name__)

#: Bumped whenever what a cached entry means changes (old entries are then ignored). 2: the JPEG walk
#: refuses a scan naming a component its frame lacks or using an undefined quantization table (1 let
#: such files through to the decoder). 3: the fast pass decodes a JPEG's image data at 1/8 scale and
#: refuses one that makes libjpeg-turbo warn (2 let such files through).
CACHE_VERSION = 3


def default_cache_dir() -> Path:
    env = os.environ.get("CROSSDALI_CACHE")
    return (Path(env) if env else Path.home() / ".cache" / "crossdali") / "check"


def file_signature(*paths: str | os.PathLike) -> list[int]:
    """``[size, mtime_ns, ...]`` of ``paths``: what must not change for a cached result to hold."""
    sig = []
    for p in paths:
        st = os.stat(p)
        sig += [st.st_size, st.st_mtime_ns]
    return sig


class CheckCache:
    """Cached results for the items of one location (``identity``), e.g. the files of one folder."""

    def __init__(self, identity: str, *, cache_dir: str | os.PathLike | None = None, enabled: bool = True) -> None:
        self.identity = identity
        self.enabled = enabled
        self.dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.path = self.dir / (hashlib.sha1(identity.encode()).hexdigest()[:20] + ".json")
        self._entries: dict[str, dict] = {}
        self._dirty = False
        if enabled and self.path.is_file():
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
                if data.get("version") == CACHE_VERSION and data.get("identity") == identity:
                    self._entries = data["entries"]
            except (OSError, ValueError, KeyError) as e:
                log.debug("ignoring unreadable check cache %s: %s", self.path, e)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, sig: list[int], *, depth: str = "fast") -> dict | None:
        """The cached entry for ``key`` if its signature still matches and it was checked at ``depth``
        (a ``full`` entry also answers a ``fast`` question)."""
        entry = self._entries.get(key) if self.enabled else None
        if entry is None or entry.get("sig") != sig:
            return None
        if depth == "full" and entry.get("full") is None:
            return None
        return entry

    def put(self, key: str, sig: list[int], **values) -> None:
        if not self.enabled:
            return
        entry = self._entries.get(key)
        if entry is None or entry.get("sig") != sig:
            entry = {"sig": sig}
            self._entries[key] = entry
        entry.update(values)
        self._dirty = True

    def save(self) -> None:
        if not (self.enabled and self._dirty):
            return
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.dir, suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"version": CACHE_VERSION, "identity": self.identity, "entries": self._entries}, f)
            os.replace(tmp, self.path)
            self._dirty = False
        except OSError as e:
            log.warning("could not write the check cache %s (%s); the next start checks again", self.path, e)
