"""The detection benchmark runs unattended on the GPU machine: check its CPU paths end to end here."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")


@pytest.mark.slow
def test_detection_benchmark_smoke(tmp_path, detection_root):
    from benchmarks.detection_loaders import get_args_parser, main

    out = tmp_path / "bench"
    main(get_args_parser().parse_args(["--out", str(out), "--data-root", str(detection_root.parents[1]), "--smoke"]))
    report = json.loads((out / "detection_loaders.json").read_text())
    rows = {r["name"]: r for r in report["loader"]}
    assert set(rows) == {"DALI CPU", "torchvision v2 DataLoader (native)"}
    for r in rows.values():
        assert "error" not in r, r
        assert r["img_s"] > 0 and r["images"] >= 3 * report["batch_size"]
        assert r["positive_anchors_per_image"] > 0
    assert (out / "detection_loaders.png").stat().st_size > 1000
