"""``--data s3://bucket/prefix``: the tiny sample set uploaded to a real S3-compatible server (moto's,
on the loopback, in a process of its own) reads as the same bits as the local copy, in every
layout; a wrong bucket, prefix or missing credentials is one line and exit 2; the secret key never
appears in what a run prints or writes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("moto")
pytest.importorskip("boto3")

from crossdali.common.classification import ClassificationTransform, create_classification_pipeline  # noqa: E402
from crossdali.common.data.check.core import CheckSettings  # noqa: E402
from crossdali.common.data.object_store import ObjectLocation, check_object_source, data_location, is_object_url  # noqa: E402
from crossdali.common.data.sources import resolve_source  # noqa: E402
from crossdali.common.errors import DataError  # noqa: E402
from crossdali.common.options import PipelineOptions  # noqa: E402
from tests.common.s3_server import SECRET_KEY, aws_env, upload_folder  # noqa: E402

#: (format, local folder under the sample set, the same under the bucket's prefix)
LAYOUTS = [("imagefolder", "imagefolder"), ("filelist", "imagefolder"), ("tfrecord", "tfrecord"),
           ("webdataset", "webdataset"), ("recordio", "recordio")]


def _val_batches(source, n: int = 2) -> list[tuple[np.ndarray, np.ndarray]]:
    options = PipelineOptions(batch_size=16, num_threads=2, device="cpu", device_id=None, seed=7)
    pipe = create_classification_pipeline(source, train=False, options=options,
                                          transform=ClassificationTransform(crop_size=64))
    pipe.build()
    out = []
    for _ in range(n):
        images, labels = pipe.run()
        out.append((np.array(images.as_tensor()), np.array(labels.as_tensor())))
    return out


def test_urls_are_kept_whole():
    assert data_location("s3://bucket/a/b") == "s3://bucket/a/b" and is_object_url("s3://bucket/a/b")
    assert data_location("/data/x") == Path("/data/x")
    assert ObjectLocation.parse("s3://bucket/a/b/") == ObjectLocation("bucket", "a/b")
    assert ObjectLocation.parse("s3://bucket") == ObjectLocation("bucket", "")
    with pytest.raises(DataError, match="names no bucket"):
        ObjectLocation.parse("s3://")


@pytest.mark.parametrize("fmt,folder", LAYOUTS, ids=[f for f, _ in LAYOUTS])
def test_same_bits_as_the_local_copy(s3_tiny_set, fmt, folder):
    _, url, local = s3_tiny_set
    remote = resolve_source(f"{url}/{folder}", "val", format=fmt)
    here = resolve_source(local / folder, "val", format=fmt)
    assert remote.num_samples == here.num_samples and remote.labels == here.labels and remote.classes == here.classes
    assert all(is_object_url(f) for f in remote.files + remote.paths)  # DALI reads the store, no local copy
    assert not any(str(local) in f for f in remote.files + remote.paths)
    for (a, la), (b, lb) in zip(_val_batches(remote), _val_batches(here)):
        np.testing.assert_array_equal(la, lb)
        np.testing.assert_array_equal(a, b)


def test_a_path_that_folded_the_url_still_reads_the_store(s3_tiny_set):
    _, url, local = s3_tiny_set
    remote = resolve_source(Path(f"{url}/imagefolder"), "val", validate=False)  # Path("s3://b/p") is "s3:/b/p"
    assert remote.num_samples == resolve_source(local / "imagefolder", "val").num_samples
    assert remote.files[0].startswith(url + "/imagefolder/val/")


def test_the_fast_check_finds_a_bad_object(s3_tiny_set, tmp_path):
    endpoint, url, local = s3_tiny_set
    bad = tmp_path / "bad"
    (bad / "val" / "a").mkdir(parents=True)
    (bad / "val" / "b").mkdir(parents=True)
    for i, f in enumerate(sorted((local / "imagefolder" / "val" / "coffee").glob("*.jpg"))[:3]):
        (bad / "val" / "a" / f.name).write_bytes(f.read_bytes())
        (bad / "val" / "b" / f.name).write_bytes(f.read_bytes()[:700] if i == 1 else f.read_bytes())
    bad_url = upload_folder(endpoint, bad, "crossdali-tests", "broken")
    with pytest.raises(DataError, match=r"broken/val/b/\S+ cannot be decoded"):
        resolve_source(bad_url, "val")
    problems, total = check_object_source(resolve_source(bad_url, "val", validate=False), settings=CheckSettings())
    assert total == 6 and [p.sample for p in problems] == ["val/b/0001.jpg"]  # the id an exclusion list takes
    assert resolve_source(bad_url, "val", validate=False).num_samples == 6


def _cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    keep = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return subprocess.run([sys.executable, "-m", "crossdali", *args], env={**keep, **env}, cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_check_works_on_the_store_and_never_shows_the_secret(s3_tiny_set, tmp_path):
    endpoint, url, _ = s3_tiny_set
    proc = _cli(["check", url, "--no-progress", "--out", str(tmp_path / "check")], aws_env(endpoint), tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "tfrecord" in proc.stdout and "webdataset" in proc.stdout and "imagefolder" in proc.stdout
    written = "".join(p.read_text(errors="replace") for p in (tmp_path / "check").rglob("*") if p.is_file())
    assert f"{url}/imagefolder" in written
    assert SECRET_KEY not in proc.stdout + proc.stderr + written


@pytest.mark.parametrize("case", ["no-bucket", "wrong-prefix", "no-credentials"])
def test_a_wrong_location_is_one_line_and_exit_2(s3_tiny_set, tmp_path, monkeypatch, capsys, case):
    from crossdali.cli import main

    _, url, _ = s3_tiny_set
    target = {"no-bucket": "s3://no-such-bucket-here/x", "wrong-prefix": f"{url}/not-there",
              "no-credentials": url}[case]
    if case == "no-credentials":
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # the command line sets its own
    with pytest.raises(SystemExit) as exited:
        main(["check", target, "--no-progress", "--out", str(tmp_path / "check")])
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and target in lines[0] and "Traceback" not in err, err
    fix = {"no-bucket": "does not exist", "wrong-prefix": "check the prefix", "no-credentials": "AWS_ACCESS_KEY_ID"}[case]
    assert fix in lines[0]
