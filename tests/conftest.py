"""Fixtures shared by every framework's tests.

The sample set is built once per data root (``$CROSSDALI_DATA``, which nox points at
``.cache/data`` for all sessions) so every framework reads the very same JPEG bytes.

Subprocesses (training scripts, launchers, benchmarks) must run this checkout's code: the
repository goes first on ``PYTHONPATH`` here, once for the whole session, so a test passes
``os.environ`` (plus its own variables) and never builds that path itself.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_paths = [str(ROOT), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(filter(None, _paths)))  # repository first, no repeats


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The checkout the tests run (the working directory of the scripts they start)."""
    return ROOT


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> Path:
    env = os.environ.get("CROSSDALI_DATA")
    return Path(env) if env else tmp_path_factory.mktemp("data")


@pytest.fixture(scope="session")
def tiny_classification(data_root) -> Path:
    """The ``tiny`` classification sample set (11 classes; 264 train, 55 val samples)."""
    from crossdali.common.sample_data import ensure_classification

    return ensure_classification(data_root, size="tiny")


@pytest.fixture(scope="session")
def indexed_val_source(tiny_classification):
    """An odd-sized (55) val set whose label is the sample's index: labels identify samples."""
    from crossdali.common.sources import DataSource, scan_image_folder

    src = scan_image_folder(tiny_classification / "imagefolder" / "val")
    assert src.num_samples % 2 == 1
    return DataSource(format="filelist", root=src.root, files=src.files,
                      labels=tuple(range(src.num_samples)), num_samples=src.num_samples)


def _assert_epoch_coverage(seen_per_shard: list[list[int]], num_samples: int) -> None:
    """Every sample id in ``range(num_samples)`` seen exactly once across all shards."""
    counts = Counter(i for shard in seen_per_shard for i in shard)
    duplicated = sorted(i for i, c in counts.items() if c > 1)
    missing = sorted(set(range(num_samples)) - set(counts))
    extra = sorted(set(counts) - set(range(num_samples)))
    assert not duplicated and not missing and not extra, (
        f"epoch coverage broken: duplicated {duplicated[:10]}, missing {missing[:10]}, unknown {extra[:10]}")


@pytest.fixture(scope="session")
def assert_epoch_coverage():
    """The one check of "every sample exactly once across all shards" used for every framework."""
    return _assert_epoch_coverage
