"""TensorFlow imported without its start-up banners, so that crossdali's first line is the first a
user reads: the oneDNN notice and absl's "All log messages before absl::InitializeLog()" line,
which TensorFlow's C++ side writes at import whatever ``TF_CPP_MIN_LOG_LEVEL`` says, and (through
``TF_CPP_MIN_LOG_LEVEL=2`` when the user has not set it) its INFO and WARNING logs such as the CPU
feature notice. ``--debug`` on the command line (or ``CROSSDALI_DEBUG=1``) keeps them all.

Anything else written to the process's stderr during the import is written out after it, and all
of it when the import fails.
"""

from __future__ import annotations

import os
import sys
import tempfile

__all__ = ["BANNERS", "import_tensorflow", "wants_debug"]

#: substrings of the lines left out
BANNERS = ("All log messages before absl::InitializeLog() is called are written to STDERR",
           "oneDNN custom operations are on")


def wants_debug() -> bool:
    """``--debug`` among the command's arguments, or ``CROSSDALI_DEBUG`` set to something other than 0."""
    return "--debug" in sys.argv[1:] or os.environ.get("CROSSDALI_DEBUG", "0") not in ("", "0")


def import_tensorflow():
    """``import tensorflow``, quietly unless ``wants_debug()``; returns the module."""
    if "tensorflow" in sys.modules or wants_debug():
        import tensorflow

        return tensorflow
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no file descriptor 2 to redirect (an embedding host): import as is
        import tensorflow

        return tensorflow
    failed = True
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow

            failed = False
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode(errors="replace").splitlines(keepends=True)
            kept = lines if failed else [line for line in lines if not any(b in line for b in BANNERS)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
    return tensorflow
