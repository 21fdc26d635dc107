"""``python -m crossdali``: the ``crossdali`` command (see ``crossdali.cli``)."""

from crossdali.cli import entry_point

if __name__ == "__main__":
    entry_point()
