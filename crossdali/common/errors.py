"""The errors a script reports as one line: "the user gave something wrong", and "an output could
not be written".

A training script catches them (``crossdali.common.scripts.script.run``), prints the message as one
line and exits 2; a library caller gets an exception whose message names the file or flag and the fix.
"""

from __future__ import annotations

__all__ = ["DataError", "UsageError", "WriteError"]


class DataError(ValueError):
    """The dataset on disk is missing, empty or malformed. The message names the path and the fix."""


class UsageError(ValueError):
    """A wrong flag value or combination, or an unusable file passed by flag. The message names
    the flag, the value and the fix."""


class WriteError(OSError):
    """An output file could not be written (a full disk, a file-size limit, a read-only folder). The
    message names the file and the cause; a file written with ``crossdali.common.files`` keeps its
    previous content."""
