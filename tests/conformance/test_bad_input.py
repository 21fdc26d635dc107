"""Every bad-input case through every framework's DALI loader: the same verdict everywhere.

The verdict is "accept" (and then every batch is finite and of the right shape) or "refuse" with
a ``DataError`` that names the file. Parametrised by framework; each framework is imported with
``pytest.importorskip``, so each nox session runs its own part against the shared ``EXPECTED``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.conformance.corpus import DECODED, EXPECTED, case_bytes, image_folder

FRAMEWORKS = ("pytorch", "tensorflow", "mxnet")


def _batches(framework: str, root: Path, backend: str = "dali-cpu") -> list[np.ndarray]:
    """Every image batch of the val split through ``framework``'s ``backend`` loader, as numpy."""
    mod = pytest.importorskip({"pytorch": "torch", "tensorflow": "tensorflow", "mxnet": "mxnet"}[framework])
    del mod
    if framework == "pytorch":
        from crossdali.pytorch import create_classification_loader

        return [x.float().numpy() for x, _ in create_classification_loader(root, train=False, batch_size=4, crop_size=32,
                                                                            workers=1, backend=backend)]
    if framework == "tensorflow":
        from crossdali.tensorflow import create_classification_loader

        return [np.transpose(x.numpy(), (0, 3, 1, 2)) for x, _ in create_classification_loader(
            root, train=False, batch_size=4, crop_size=32, workers=1, backend=backend)]
    from crossdali.mxnet import create_classification_loader

    it = create_classification_loader(root, train=False, batch_size=4, crop_size=32, workers=1)
    return [b.data[0].asnumpy()[: 4 - b.pad] for b in it]


def _verdict(framework: str, root: Path, name: str, backend: str = "dali-cpu") -> str:
    from crossdali.common.errors import DataError

    try:
        batches = _batches(framework, root, backend)
    except DataError as e:
        assert name in str(e), f"the error does not name {name}: {e}"
        return "refuse"
    images = np.concatenate(batches)
    assert images.shape == (7, 3, 32, 32) and np.isfinite(images).all()
    return "accept"


@pytest.fixture(scope="module")
def corpus(tiny_classification):
    return case_bytes(tiny_classification)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CROSSDALI_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_same_verdict_in_every_framework(framework, case, corpus, tiny_classification, tmp_path):
    name, data = corpus[case]
    root = image_folder(tmp_path / "data", tiny_classification, name, data)
    # by default the loaders run the fast pass, which decodes JPEG image data at 1/8 scale
    expected = "accept" if EXPECTED[case] == "accept" else "refuse"
    assert _verdict(framework, root, name) == expected


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])  # MXNet's native backend reads RecordIO only
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_native_backends_reach_the_same_verdict(framework, case, corpus, tiny_classification, tmp_path):
    """torchvision's and tf.data's own decoders, behind the same fast check: a real image or a refusal
    naming the file, as with DALI."""
    name, data = corpus[case]
    root = image_folder(tmp_path / "data", tiny_classification, name, data)
    expected = "accept" if EXPECTED[case] == "accept" else "refuse"
    assert _verdict(framework, root, name, backend="native") == expected


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("case", sorted(DECODED))
def test_fast_and_full_check_agree_with_the_decoder(framework, case, corpus, tiny_classification, tmp_path):
    """Damage found only by decoding the image data: the fast pass (the default before training),
    the full pass and DALI's own decoder alone reach the same code, and every loader refuses the file."""
    from crossdali.common.data.check import check_data
    from crossdali.common.data.check.decode import decode_samples

    name, data = corpus[case]
    root = image_folder(tmp_path / "data", tiny_classification, name, data)
    for depth in ("fast", "full"):
        report = check_data(root, depth=depth, device="cpu", use_cache=False)
        assert [(p.code, p.sample) for p in report.errors] == [(EXPECTED[case], f"val/b/{name}")], depth
    assert decode_samples([(name, data)], device="cpu", batch_size=1)[name][0] == EXPECTED[case]
    assert _verdict(framework, root, name) == "refuse"


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_exclusion_list_trains_on_the_rest(framework, corpus, tiny_classification, tmp_path):
    """The exclusion list the check writes is accepted by every framework's loader."""
    from crossdali.common.data.check import check_data

    root = tmp_path / "data"
    for case in ("gif", "truncated", "forged-30000"):
        image_folder(root, tiny_classification, *corpus[case])
    report = check_data(root, depth="fast", device="cpu")
    _, exclude = report.write(tmp_path / "check")
    assert len(report.errors) == 3
    pytest.importorskip({"pytorch": "torch", "tensorflow": "tensorflow", "mxnet": "mxnet"}[framework])
    module = __import__(f"crossdali.{framework}", fromlist=["create_classification_loader"])
    from crossdali.common.data.sources import resolve_source

    source = resolve_source(root, "val", exclude=exclude)
    assert source.num_samples == 6
    loader = module.create_classification_loader(source, train=False, batch_size=4, crop_size=32, workers=1)
    n = sum(int(b.data[0].shape[0] - b.pad) for b in loader) if framework == "mxnet" else \
        sum(int(x.shape[0]) for x, _ in loader)
    assert n == 6


# VmHWM, the peak RSS of this process's own memory since its exec. Not getrusage's ru_maxrss: Linux
# carries the parent's peak across fork/vfork + exec into it, so a probe started by a pytest process
# that had grown past 2 GiB "peaked" at 2.1 GiB in CI while its own peak was 0.75 GiB.
_RSS_PROBE = textwrap.dedent("""
    import json, sys
    from crossdali.common.errors import DataError
    from crossdali.{framework} import create_classification_loader
    try:
        loader = create_classification_loader(sys.argv[1], train=False, batch_size=4, crop_size=32, workers=1)
        for _ in loader:
            pass
        verdict = "accept"
    except DataError as e:
        verdict = "refuse" if "forged.jpg" in str(e) else "refuse-unnamed"
    with open("/proc/self/status") as status:
        peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    print(json.dumps({{"verdict": verdict, "peak_rss_kib": peak}}))
""")


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_forged_header_memory_stays_bounded(framework, corpus, tiny_classification, tmp_path):
    """A header that claims 30000x30000 (2.5 GiB of pixels) is refused from the header: the
    process never grows past the framework's own footprint (measured in a subprocess)."""
    pytest.importorskip({"pytorch": "torch", "tensorflow": "tensorflow", "mxnet": "mxnet"}[framework])
    root = image_folder(tmp_path / "data", tiny_classification, *corpus["forged-30000"])
    env = dict(os.environ, CROSSDALI_CACHE=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", _RSS_PROBE.format(framework=framework), str(root)], env=env,
                         capture_output=True, text=True, timeout=300, check=True)  # about 10 s here
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["verdict"] == "refuse"
    assert result["peak_rss_kib"] < 2 * 2**20, result  # 2 GiB: decoding the image alone would take 2.5 GiB
