"""docs/from-dataloader.md runs: its Python blocks, in order, in one fresh interpreter, on the CPU.

Each block's own asserts check what the text around it claims (batch shapes, the grey branch taken
by some samples and not all, the pruned decoder, the error naming the bad file)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "from-dataloader.md"


def guide_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)


def test_guide_has_the_promised_steps():
    text = GUIDE.read_text()
    for topic in ("external_source", "SampleInfo", "enable_conditionals=True", "debug=True", "experimental.dynamic",
                  "pruned", "DataError"):
        assert topic in text, f"the guide no longer covers {topic}"
    assert len(guide_blocks()) >= 7


@pytest.mark.slow
def test_every_code_block_runs(tmp_path):
    script = tmp_path / "guide.py"
    script.write_text("\n\n".join(f"# --- block {i}\n{code}" for i, code in enumerate(guide_blocks())))
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=dict(os.environ), capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    for line in ("torchvision loss", "crossdali loss", "plain DALI batch", "external_source:",
                 "took the grey branch", "the decoder was pruned", "gif-in-disguise.jpg", "decoded shapes:"):
        assert line in out, f"{line!r} missing from the guide's output:\n{out[-2000:]}"
