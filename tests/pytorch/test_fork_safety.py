"""A worker forked from a process holding a dead DALI pipeline in a reference cycle must not run
its finaliser (``crossdali.common.loading.fork_safety``): DALI's Python workers and PyTorch's DataLoader
workers, on real JPEG bytes. Each case is a subprocess: a crash or a hang stays inside it, and under
pytest the cycle did not reach the worker while in a plain script it did."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("torch")

_SCRIPT = """
import gc, json, sys
from pathlib import Path

import torch

from crossdali.pytorch.external import ExternalSourceOptions, create_external_source_loader

kind, files = sys.argv[1], json.loads(sys.argv[2])
items = [(Path(f).read_bytes(), i) for i, f in enumerate(files)]


class CollectingSource(torch.utils.data.Dataset):  # the worker's own garbage collection, as a busy source has
    def __len__(self):
        return len(items)

    def __getitem__(self, i):
        gc.collect()
        return items[i] if kind == "dali-worker" else i


def dali_loader(source, **kw):
    return create_external_source_loader(source, train=False, batch_size=8, crop_size=32, workers=2,
                                         num_classes=len(items), **kw)


gc.disable()  # the cycle stays uncollected until the fork, as in a busy process between collections
dead = dali_loader(items[:16])
next(iter(dead))
cycle = [dead]
cycle.append(cycle)
del dead, cycle
if kind == "dali-worker":
    live = dali_loader(CollectingSource(), feed=ExternalSourceOptions(parallel=True, py_workers=1,
                                                                      py_start_method="fork"))
    seen = (int(i) for _, labels in live for i in labels.tolist())
else:
    seen = (int(i) for batch in iter(torch.utils.data.DataLoader(CollectingSource(), batch_size=8, num_workers=1))
            for i in batch.tolist())
gc.enable()
print(json.dumps(sorted(seen)))
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dali-worker", "dataloader-worker"])
def test_forked_worker_survives_a_dead_pipeline_in_the_parent(kind, indexed_val_source, tmp_path):
    """CI regression (dali-worker): the worker's garbage collection ran ``Pipeline.__del__`` on a
    backend with no threads in the child: 'Worker data receiving interrupted' here, a segfault and a
    suite hung to CI's limit there. A DataLoader worker hung silently the same way."""
    script = tmp_path / "dead_pipeline.py"
    script.write_text(_SCRIPT)
    files = json.dumps([str(f) for f in indexed_val_source.files])
    # its own process group: a hung worker is killed with its parent, not left behind
    proc = subprocess.Popen([sys.executable, str(script), kind, files], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:  # about 5 s here; the limit turns a hung worker into a failure
        stdout, stderr = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"the {kind} hung for 180 s after forking from a process holding a dead pipeline")
    assert proc.returncode == 0, stderr[-3000:]
    assert json.loads(stdout.splitlines()[-1]) == list(range(len(indexed_val_source.files)))
