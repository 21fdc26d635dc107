"""``benchmarks/loader_formats.py --smoke``: the input-format benchmark runs its real rows (DALI CPU
on the ImageFolder and on the WebDataset shards of the same JPEGs; the multi-label list through
DALI external_source, serial and in worker processes, and through a torchvision DataLoader) on the
tiny sets and writes a JSON with whole epochs, a positive rate and no error per row, and a plot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchvision")
pytest.importorskip("matplotlib")

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_loader_formats_benchmark_smoke(tmp_path, data_root):
    env = {**os.environ, "CROSSDALI_DATA": str(data_root), "OMP_NUM_THREADS": "2"}
    # 25-28 s here on the shared 2 cores (most of it starting the spawned DALI workers): the timeout is 10x that
    proc = subprocess.run([sys.executable, "-m", "benchmarks.loader_formats", "--smoke", "--out", str(tmp_path)],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "loader_formats.json").read_text())
    rows = {r["name"]: r for r in report["results"]}
    assert set(rows) == {"ImageFolder JPEGs -> DALI CPU readers.file",
                         "WebDataset shards -> DALI CPU readers.webdataset",
                         "multi-label list -> DALI CPU external_source (serial)",
                         "multi-label list -> DALI CPU external_source (2 worker processes)",
                         "multi-label list -> torchvision (PIL, DataLoader, 2 workers)"}
    data = report["dataset"]
    assert data["jpegs"] == data["webdataset_samples"] == 264 and data["multilabel_images"] == 96
    for row in rows.values():
        assert "error" not in row, row
        per_epoch = 96 if row["format"] == "multilabel" else 264
        assert row["epochs"] >= 2 and row["images"] == per_epoch * row["epochs"] and row["img_s"] > 0, row  # whole epochs
    assert (tmp_path / "loader_formats.png").stat().st_size > 10_000


@pytest.mark.parametrize("module", ["benchmarks.loader_formats", "benchmarks.classification_loaders"])
def test_gpu_benchmark_without_a_gpu_is_one_line_and_exit_2(module, tmp_path):
    """A GPU benchmark started where there is no GPU is the user's mistake: one line, exit code 2."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = subprocess.run([sys.executable, "-m", module, "--out", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and "GPU" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "loader_formats.json").exists() and not (tmp_path / "classification_loaders.json").exists()
