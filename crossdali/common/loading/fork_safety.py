"""A forked child must never run the finaliser of a DALI pipeline it inherited.

A forked process inherits every object of its parent. A finished DALI pipeline waiting in a
reference cycle is garbage in the child too; when the child's garbage collector frees it,
``Pipeline.__del__`` shuts down a backend whose threads exist only in the parent. Measured here: a
DALI Python worker (``external_source(parallel=True)``, fork) crashed ('Worker data receiving
interrupted'; a segfault and a hung suite in CI), and a PyTorch ``DataLoader`` worker hung without
a word. Both forks happen inside the libraries, so the cure is a fork hook: freeze every object of
the parent just before any fork (a frozen object is never collected, and the child inherits it
frozen: the child leaks the dead pipeline instead of finalising it), unfreeze in the parent just
after, where the collector then frees it as usual. ``gc.freeze`` only moves list heads: no cost.
Hand-written: neither DALI nor PyTorch does this.
"""

from __future__ import annotations

import gc
import os

_installed = False
_froze = False


def _before_fork() -> None:
    global _froze
    # a process that already freezes for its own pre-fork scheme keeps it untouched
    _froze = gc.get_freeze_count() == 0
    if _froze:
        gc.freeze()


def _after_fork_in_parent() -> None:
    global _froze
    if _froze:
        gc.unfreeze()
        _froze = False


def install() -> None:
    """Register the hooks once per process (``import crossdali.common`` does it)."""
    global _installed
    if not _installed:
        os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent)
        _installed = True
