"""Start an MXNet ``dist_sync`` job on this machine: scheduler, servers and N workers.

    python -m crossdali.mxnet.launch -n 2 -- python -m crossdali.mxnet.train_classification --epochs 1

MXNet's own ``tools/launch.py`` ships in the wheel without the ``dmlc_tracker`` it imports, so
this is the local launcher (one node). For several nodes use ``tools/launch.py`` from the MXNet
repository (ssh, mpi, sge, yarn) or Horovod. Importing mxnet with ``DMLC_ROLE=scheduler`` or
``server`` runs that role until the workers finish, so those processes need no script.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="local MXNet dist_sync launcher", add_help=add_help)
    parser.add_argument("-n", "--num-workers", type=int, required=True)
    parser.add_argument("-s", "--num-servers", type=int, default=1)
    parser.add_argument("--port", type=int, default=0, help="scheduler port (default: a free one)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the worker command")
    return parser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise SystemExit("give the worker command after --, e.g. -- python -m crossdali.mxnet.train_classification")
    if args.num_workers < 1 or args.num_servers < 1:
        raise SystemExit(f"-n and -s must be positive, got {args.num_workers} and {args.num_servers}")
    env = {**os.environ, "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(args.port or _free_port()),
           "DMLC_NUM_WORKER": str(args.num_workers), "DMLC_NUM_SERVER": str(args.num_servers),
           "DMLC_NODE_HOST": "127.0.0.1"}
    role_cmd = [sys.executable, "-c", "import mxnet"]
    helpers = [subprocess.Popen(role_cmd, env={**env, "DMLC_ROLE": "scheduler"})]
    helpers += [subprocess.Popen(role_cmd, env={**env, "DMLC_ROLE": "server"}) for _ in range(args.num_servers)]
    workers = [subprocess.Popen(command, env={**env, "DMLC_ROLE": "worker"}) for _ in range(args.num_workers)]
    status = 0
    try:
        pending = list(workers)
        while pending:
            for w in list(pending):
                if w.poll() is not None:
                    pending.remove(w)
                    if w.returncode != 0 and status == 0:
                        status = w.returncode
                        print(f"crossdali.mxnet.launch: a worker exited with {w.returncode}; stopping the job",
                              file=sys.stderr)
                        for other in pending:
                            other.terminate()
            time.sleep(0.2)
        for h in helpers:
            try:
                h.wait(timeout=30 if status == 0 else 1)
            except subprocess.TimeoutExpired:
                h.terminate()
    finally:
        for p in workers + helpers:
            if p.poll() is None:
                p.kill()
    return status


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
