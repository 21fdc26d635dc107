"""``crossdali.video.reencode``: a constant frame rate in VP9 or H.264, with key frames exactly where
``--key-every`` puts them (the loader decodes each shuffled clip from the key frame before it), and
a user's mistake is one line with exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

av = pytest.importorskip("av")
ROOT = Path(__file__).resolve().parents[2]


def _source(tmp_path: Path, frames: int = 40) -> Path:
    from crossdali.common.data.sample_data.video import write_video

    rng = np.random.default_rng(0)
    return write_video(tmp_path / "src.webm", rng.integers(0, 256, (frames, 64, 64, 3), dtype=np.uint8))


def _stream(path: Path) -> tuple[str, int, list[int]]:
    """Codec name, frame count and the display-order indices of the key frames (demux only)."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        packets = sorted((p.pts, p.is_keyframe) for p in container.demux(stream) if p.size)
        return stream.codec_context.name, len(packets), [i for i, (_, key) in enumerate(packets) if key]


@pytest.mark.parametrize(("suffix", "codec"), [(".mp4", "h264"), (".webm", "vp9")])
def test_key_frames_every_n_frames_and_nowhere_else(tmp_path, suffix, codec):
    from crossdali.video.reencode import reencode

    src = _source(tmp_path)
    dst = tmp_path / f"out{suffix}"
    assert reencode(src, dst, fps=25, key_every=8) == 40
    assert _stream(dst) == (codec, 40, [0, 8, 16, 24, 32])


def test_cli_writes_h264_and_refuses_mistakes_in_one_line(tmp_path):
    src = _source(tmp_path, frames=12)
    cmd = [sys.executable, "-m", "crossdali.video.reencode"]
    proc = subprocess.run([*cmd, str(src), str(tmp_path / "out.mp4"), "--key-every", "4"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "12 frames at a constant 25 fps (H.264, a key frame every 4 frames)" in proc.stdout
    assert _stream(tmp_path / "out.mp4") == ("h264", 12, [0, 4, 8])
    for argv, words in [([str(src), str(tmp_path / "out.avi")], "must be a .webm (VP9) or .mp4 (H.264) file"),
                        ([str(tmp_path / "missing.mp4"), str(tmp_path / "o.mp4")], "missing.mp4 does not exist")]:
        proc = subprocess.run([*cmd, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and words in lines[0], proc.stderr
