"""Run by test_launchers.py under torchrun, horovodrun or alone: checks this rank's share of
data-parallel training and writes what it saw to ``<out>/rank<R>.json``.

- sharding: which val samples this rank's DALI loader yields (labels are sample indices);
- broadcast: the model's parameters after wrapping, from a rank-dependent initialisation;
- gradient averaging: parameters after one SGD step on rank-dependent inputs;
- metric reduction: ``Runtime.all_reduce_sum`` of rank-dependent values.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from crossdali.pytorch import create_classification_loader
from crossdali.pytorch.distributed import init_distributed


def main(data: Path, out: Path) -> None:
    runtime = init_distributed()
    rank = runtime.dist.rank
    loader = create_classification_loader(data, train=False, backend="dali-cpu", batch_size=8, crop_size=16,
                                          workers=1, dist=runtime.dist, data_format="filelist")
    seen = [i for _, labels in loader for i in labels.tolist()]

    torch.manual_seed(100 + rank)  # every rank starts from different weights: broadcast must fix that
    model = torch.nn.Linear(4, 1)
    initial = [p.detach().flatten().tolist() for p in model.parameters()]
    ddp_model = runtime.wrap_model(model)
    optimizer = runtime.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=1.0), model)
    after_broadcast = [p.detach().flatten().tolist() for p in model.parameters()]
    inputs = torch.arange(8, dtype=torch.float32).view(2, 4) * (rank + 1)  # rank-dependent gradient
    optimizer.zero_grad()
    ddp_model(inputs).sum().backward()
    optimizer.step()
    after_step = [p.detach().flatten().tolist() for p in model.parameters()]

    reduced = runtime.all_reduce_sum([rank + 1.0, len(seen)])
    (out / f"rank{rank}.json").write_text(json.dumps({
        "dist": [rank, runtime.dist.world_size, runtime.dist.local_rank, runtime.dist.launcher],
        "engine": runtime.engine, "seen": seen, "initial": initial, "after_broadcast": after_broadcast,
        "inputs": inputs.tolist(), "after_step": after_step, "reduced": reduced}))
    runtime.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
