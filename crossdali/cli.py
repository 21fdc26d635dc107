"""``crossdali`` command: ``crossdali make-data [...]`` builds the embedded sample datasets."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    commands = {"make-data": "crossdali.common.sample_data.__main__"}
    if not argv or argv[0] not in commands:
        print(f"usage: crossdali {{{','.join(commands)}}} [options]   (add --help after a command)", file=sys.stderr)
        raise SystemExit(2)
    import importlib

    module = importlib.import_module(commands[argv[0]])
    module.main(module.get_args_parser().parse_args(argv[1:]))
