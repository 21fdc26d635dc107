"""Run by test_resume.py (alone or under torchrun): the real classification script, plus a record
of what every training step saw, and optionally a signal to this very process at one step.

    python resume_probe.py LOG KILL_AT SIGNAL KILL_RANK -- <train_classification flags>

``LOG`` (``{rank}`` is replaced) gets one JSON line per training step: the step's labels (sample
indices in the test's data) and its loss. At training step ``KILL_AT`` of this process (counted
from 1; 0: never) rank ``KILL_RANK`` sends itself ``SIGNAL`` (TERM or KILL) in the middle of the
step, between the forward and the backward pass. The hook only observes: the script, its loaders,
its signal handling and its checkpoints run unchanged.
"""

import json
import os
import signal
import sys

import torch

from crossdali.common.distributed import detect_distributed
from crossdali.common.scripts.script import run
from crossdali.pytorch import train_classification

if __name__ == "__main__":
    log_path, kill_at, signame, kill_rank = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    argv = sys.argv[sys.argv.index("--") + 1:]
    rank = detect_distributed().rank
    log_file = open(log_path.format(rank=rank), "a", encoding="utf-8")  # noqa: SIM115 - open for the whole run
    steps = 0

    def record(module, args, output):
        global steps
        if not isinstance(module, torch.nn.CrossEntropyLoss) or not torch.is_grad_enabled():
            return  # evaluation runs under inference mode
        steps += 1
        log_file.write(json.dumps({"labels": args[1].tolist(), "loss": output.item()}) + "\n")
        log_file.flush()
        if steps == kill_at and rank == kill_rank:
            os.kill(os.getpid(), getattr(signal, f"SIG{signame}"))

    torch.nn.modules.module.register_module_forward_hook(record)
    run(train_classification.main, train_classification.get_args_parser(), argv)
