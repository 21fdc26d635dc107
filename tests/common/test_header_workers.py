"""Header worker processes (check.header_workers): every file's header, in order, whatever process
read it, and a worker that dies leaves its files to the parent instead of losing them."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from crossdali.common.check import header_workers
from crossdali.common.check.core import _inspect_one

pytestmark = pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(),
                                reason="the dying worker below is a forked one")
_PARENT = os.getpid()


def _dies_in_a_worker(path: str) -> tuple[dict, bool]:
    if os.getpid() != _PARENT and path.endswith("die.jpg"):
        os._exit(3)  # a worker killed mid-block (OOM killer, a crash in a library)
    return _inspect_one(path)


@pytest.fixture
def mixed_files(tiny_classification, tmp_path) -> list[str]:
    """Good JPEGs with a text file, an empty file and a truncated JPEG among them."""
    files = sorted(str(p) for p in (tiny_classification / "imagefolder" / "val").rglob("*.jpg"))[:40]
    (tmp_path / "page.jpg").write_text("<html>not found</html>")
    (tmp_path / "empty.jpg").write_bytes(b"")
    (tmp_path / "cut.jpg").write_bytes(open(files[0], "rb").read()[:500])
    return files[:10] + [str(tmp_path / "page.jpg")] + files[10:25] + [str(tmp_path / "empty.jpg"),
                                                                          str(tmp_path / "cut.jpg")] + files[25:]


def test_processes_give_each_header_in_order(mixed_files, monkeypatch):
    monkeypatch.setattr(header_workers, "BLOCK", 4)  # 11 blocks over 3 workers, dealt round-robin
    expected = [_inspect_one(p) for p in mixed_files]
    got = list(header_workers.inspect_in_processes(mixed_files, 3, _inspect_one))
    assert got == expected
    assert [info["problems"][0][0] for info, _ in got if info["problems"]] == ["not-an-image", "empty", "truncated"]


def test_a_dead_worker_leaves_its_blocks_to_the_parent(mixed_files, tmp_path, monkeypatch):
    monkeypatch.setattr(header_workers, "BLOCK", 4)
    die = tmp_path / "die.jpg"
    die.write_bytes(open(mixed_files[0], "rb").read())
    files = mixed_files[:5] + [str(die)] + mixed_files[5:]  # block 1, worker 1 of 2: it dies there
    got = list(header_workers.inspect_in_processes(files, 2, _dies_in_a_worker))
    assert got == [_inspect_one(p) for p in files]
