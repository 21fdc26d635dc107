"""The full pass's decoder (``check.decode.decode_samples``): chunks decoded pipelined, a failing or
warning chunk searched batch by batch, then sample by sample, so the culprit is named exactly."""

from __future__ import annotations

import os

import pytest

from crossdali.common.data.check.decode import CHUNK_SAMPLES, decode_file_list, decode_files, decode_samples
from tests.conformance.corpus import EXPECTED, FULL_ONLY, case_bytes


@pytest.fixture(scope="module")
def corpus(tiny_classification):
    return case_bytes(tiny_classification)


def _stream(good: bytes, n: int, bad: dict[int, bytes]) -> list[tuple[str, bytes]]:
    return [(f"s{i}", bad.get(i, good)) for i in range(n)]


def _files(folder, n: int, special: dict[int, bytes], good: bytes) -> list[str]:
    """``n`` JPEG files in ``folder``: ``special[i]`` where given, else ``good``."""
    paths = []
    for i in range(n):
        path = folder / f"{i:05d}.jpg"
        path.write_bytes(special.get(i, good))
        paths.append(str(path))
    return paths


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_bad_samples_anywhere_in_a_long_stream_are_named(device, corpus):
    """Two chunks (batch 4): a failing sample in the first, a warning one in the second's last batch,
    and a short tail; every other sample decodes without a word."""
    good = corpus["good"][1]
    chunk = 4 * max(4, -(-CHUNK_SAMPLES[device] // 4))
    n = chunk + 9
    bad_at = {5: corpus["bad-huffman"][1], chunk + 6: corpus["warning-only"][1]}
    done: list[int] = []
    bad = decode_samples(_stream(good, n, bad_at), device=device, batch_size=4, threads=2, on_batch=done.append)
    assert sum(done) == n
    assert bad["s5"][0] == "decode-failed"
    if device == "cpu":  # libjpeg-turbo warns; the GPU decoders may decode the cut data silently
        assert set(bad) == {"s5", f"s{chunk + 6}"} and bad[f"s{chunk + 6}"][0] == "decoder-warning"
    else:
        assert set(bad) <= {"s5", f"s{chunk + 6}"}


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_files_read_by_dali_bad_ones_named_wherever_they_are(device, corpus, tmp_path):
    """File names through DALI (fn.io.file.read) over two chunks and a tail (batch 4): a failure in
    the first chunk (the pipeline is rebuilt after it), a warning on the first sample of the second
    chunk and in the last, short batch; nothing else named, every file counted."""
    chunk = 4 * max(4, -(-CHUNK_SAMPLES[device] // 4))
    n = 2 * chunk + 3
    special = {5: corpus["bad-huffman"][1], chunk: corpus["warning-only"][1], n - 1: corpus["warning-only"][1],
               n - 2: corpus["bad-huffman"][1]}
    paths = _files(tmp_path, n, special, corpus["good"][1])
    done: list[int] = []
    bad = decode_files(paths, device=device, batch_size=4, threads=2, on_batch=done.append)
    assert sum(done) == n
    assert {k: v[0] for k, v in bad.items() if v[0] == "decode-failed"} == {paths[5]: "decode-failed",
                                                                             paths[n - 2]: "decode-failed"}
    if device == "cpu":  # libjpeg-turbo warns; the GPU decoders may decode the cut data silently
        assert set(bad) == {paths[i] for i in special}


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("failing", [True, False], ids=["failure", "warnings-only"])
def test_file_list_through_the_reader_names_what_the_streaming_pass_names(device, failing, corpus, tmp_path):
    """``decode_file_list`` (DALI's file reader, the GPU full pass) over two windows and a short tail
    (batch 4): the same culprits as ``decode_files``, nothing else, every file counted once. With a
    failure in the first window the rest is decoded after it; without, a warning on the first file of
    the second window and one in the last batch are pinned although the reader ran ahead of both."""
    chunk = 4 * max(4, -(-CHUNK_SAMPLES[device] // 4))
    n = 2 * chunk + 3
    special = {chunk: corpus["warning-only"][1], n - 1: corpus["warning-only"][1]}
    if failing:
        special.update({5: corpus["bad-huffman"][1], n - 2: corpus["bad-huffman"][1]})
    paths = _files(tmp_path, n, special, corpus["good"][1])
    done: list[int] = []
    bad = decode_file_list(paths, device=device, batch_size=4, threads=2, on_batch=done.append)
    assert sum(done) == n
    failed = {paths[5], paths[n - 2]} if failing else set()
    assert {k for k, v in bad.items() if v[0] == "decode-failed"} == failed
    if device == "cpu":  # libjpeg-turbo warns; the GPU decoders may decode the cut data silently
        assert set(bad) == {paths[i] for i in special}
        assert bad == decode_files(paths, device=device, batch_size=4, threads=2)
    assert decode_file_list([], device=device) == {}


def test_full_check_through_the_file_reader_gives_the_streaming_report(corpus, tiny_classification, tmp_path,
                                                                       monkeypatch):
    """Every corpus case in one folder: the full pass that reads every header first and decodes
    through DALI's file reader (the GPU's way, forced here on the CPU) finds exactly what the
    streaming full pass finds, and counts every file once on the progress bar."""
    from crossdali.common.data.check import core
    from crossdali.common.data.check.core import CheckSettings, check_image_files
    from crossdali.common.data.sources import scan_image_folder
    from tests.conformance.corpus import image_folder

    root = tmp_path / "data"
    for case in sorted(corpus):
        image_folder(root, tiny_classification, *corpus[case])
    files = list(scan_image_folder(root / "val", validate=False).files)
    reports = []
    for devices in ((), ("cpu",)):
        monkeypatch.setattr(core, "FILE_READER_DEVICES", devices)
        ticks: list[int] = []
        settings = CheckSettings(depth="full", threads=2, batch_size=4, use_cache=False, progress=ticks.append)
        problems, _ = check_image_files(files, root=root / "val", settings=settings)
        assert sum(ticks) == len(files)
        reports.append(sorted((p.sample, p.code) for p in problems))
    assert reports[0] == reports[1]
    assert {code for _, code in reports[1]} >= {"decoder-warning", "too-large", "truncated"}


def test_a_stream_shorter_than_the_pipeline_depth(corpus):
    """One batch only (the pipelined decoder needs two to start): decoded synchronously, still named."""
    bad = decode_samples(_stream(corpus["good"][1], 3, {1: corpus["bad-huffman"][1]}), batch_size=4, threads=1)
    assert list(bad) == ["s1"] and bad["s1"][0] == "decode-failed"
    assert bad["s1"][1] == "DALI's decoder failed (Bogus Huffman table definition)"  # libjpeg's reason, not DALI's
    assert decode_samples([], batch_size=4) == {}


@pytest.mark.gpu
def test_full_check_on_the_gpu_reaches_the_cpu_verdicts(corpus, tiny_classification, tmp_path, monkeypatch):
    """Every corpus case in one folder: the GPU full pass refuses what the CPU full pass refuses,
    except decoder warnings, which only libjpeg-turbo (CPU) prints."""
    from crossdali.common.data.check import check_data
    from tests.conformance.corpus import image_folder

    monkeypatch.setenv("CROSSDALI_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "data"
    for case in sorted(corpus):
        image_folder(root, tiny_classification, *corpus[case])
    verdicts = {}
    for device in ("cpu", "gpu"):
        monkeypatch.setenv("CROSSDALI_CACHE", str(tmp_path / f"cache-{device}"))
        report = check_data(root, depth="full", device=device)
        verdicts[device] = {p.path.rsplit("/", 1)[-1]: p.code for p in report.errors}
    print(verdicts)
    cpu, gpu = verdicts["cpu"], verdicts["gpu"]
    assert {k: v for k, v in cpu.items() if v != "decoder-warning"} == {k: v for k, v in gpu.items()
                                                                        if v != "decoder-warning"}


@pytest.mark.parametrize("depth", ["fast", "full"])
def test_headers_inspected_in_processes_give_the_same_report(depth, corpus, tiny_classification, tmp_path):
    """``processes`` (on by default on many cores and many files) changes where headers are read,
    not what is found: every corpus case, the same problems, headers and progress count. The progress
    callback writes to file descriptor 2 as a terminal bar does: the decoder captures it to read
    decoder warnings, so the bar must be drawn outside that capture (it would make the chunk look
    like a warning and be decoded again, batch by batch)."""
    from crossdali.common.data.check.core import CheckSettings, check_image_files
    from crossdali.common.data.sources import scan_image_folder
    from tests.conformance.corpus import image_folder

    root = tmp_path / "data"
    for case in sorted(corpus):
        image_folder(root, tiny_classification, *corpus[case])
    files = list(scan_image_folder(root / "val", validate=False).files)
    reports = []
    stderr = os.fstat(2)
    for processes in (0, 2):
        ticks: list[int] = []
        captured: list[int] = []  # ticks that came while the decoder had file descriptor 2 redirected

        def bar(n: int, ticks=ticks, captured=captured) -> None:
            ticks.append(n)
            now = os.fstat(2)
            if (now.st_dev, now.st_ino) != (stderr.st_dev, stderr.st_ino):
                captured.append(n)
            os.write(2, f"\rchecked {sum(ticks)} files".encode())

        settings = CheckSettings(depth=depth, threads=2, batch_size=4, use_cache=False, processes=processes,
                                 progress=bar)
        problems, infos = check_image_files(files, root=root / "val", settings=settings)
        assert sum(ticks) == len(files) and not captured
        reports.append(([p.to_json() for p in problems], {k: v.to_json() for k, v in infos.items()}))
    assert reports[0] == reports[1]
    refused = {p["path"].rsplit("/", 1)[-1] for p in reports[0][0] if p["severity"] == "error"}
    assert refused == {corpus[c][0] for c, verdict in EXPECTED.items()
                       if verdict != "accept" and (depth == "full" or c not in FULL_ONLY)}
