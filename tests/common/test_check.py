"""``crossdali check``: record indexes, COCO annotations, the cache, the command line, explain_*."""

from __future__ import annotations

import json
import shutil

import pytest

from crossdali.common.data.sources import resolve_source
from crossdali.common.errors import DataError


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CROSSDALI_CACHE", str(tmp_path / "cache"))


def _records(tmp_path, tiny, fmt):
    src = tiny / ("tfrecord" if fmt == "tfrecord" else "recordio")
    dst = tmp_path / fmt
    shutil.copytree(src, dst)
    return dst, dst / ("val.tfrecord" if fmt == "tfrecord" else "val.rec"), dst / "val.idx"


def test_stale_tfrecord_index_is_refused_and_named(tmp_path, tiny_classification):
    data, rec, idx = _records(tmp_path, tiny_classification, "tfrecord")
    lines = idx.read_text().splitlines()
    idx.write_text("".join(f"{int(a) + 7} {b}\n" for a, b in (ln.split() for ln in lines)))
    with pytest.raises(DataError, match=r"val\.tfrecord does not match its index .*val\.idx: 55 of 55 records.*"
                                        r"tfrecord2idx"):
        resolve_source(data, "val")


def test_recordio_index_past_the_end_and_missing_records(tmp_path, tiny_classification):
    data, rec, idx = _records(tmp_path, tiny_classification, "recordio")
    lines = idx.read_text().splitlines()
    idx.write_text("\n".join(lines[:10] + ["10\t99999999"]) + "\n")
    with pytest.raises(DataError, match=r"val\.rec does not match its index .*past the end of the file"):
        resolve_source(data, "val")
    idx.write_text("\n".join(lines[:10]) + "\n")  # 45 records no index line lists: never read
    with pytest.raises(DataError, match=r"val\.rec has \d+ bytes that no line of its index .* never read"):
        resolve_source(data, "val")


def test_bad_record_is_excluded_through_a_filtered_index(tmp_path, tiny_classification):
    from crossdali.common.classification import ClassificationTransform, PipelineOptions, create_classification_pipeline
    from crossdali.common.data.check import check_data
    from crossdali.common.data.sample_data.formats import write_tfrecord

    data = tmp_path / "tf"
    data.mkdir()
    photos = sorted((tiny_classification / "imagefolder" / "val" / "coffee").glob("*.jpg"))
    samples = [(p.read_bytes(), 3) for p in photos] + [(b"GIF89a" + bytes(100), 1)]
    write_tfrecord(data / "val.tfrecord", samples)
    report = check_data(data, device="cpu")
    assert [(p.sample, p.code) for p in report.errors] == [("val.tfrecord#5", "not-an-image")]
    _, exclude = report.write(tmp_path / "check")
    source = resolve_source(data, "val", exclude=exclude)
    assert source.num_samples == 5 and source.index_paths[0] != str(data / "val.idx")
    pipe = create_classification_pipeline(source, train=False, options=PipelineOptions(batch_size=5, num_threads=1),
                                          transform=ClassificationTransform(crop_size=16))
    pipe.build()
    _, labels = pipe.run()
    assert [int(x) for x in labels.as_array().ravel()] == [3] * 5  # the GIF record (label 1) is never read


@pytest.fixture(scope="module")
def detection_root(data_root):
    from crossdali.common.data.sample_data.detection import ensure_detection

    return ensure_detection(data_root, "tiny")


def test_coco_size_mismatch_missing_file_and_exclusion(tmp_path, detection_root):
    from crossdali.common.data.check import check_data
    from crossdali.common.detection import resolve_detection_source

    root = tmp_path / "coco"
    shutil.copytree(detection_root, root)
    ann = root / "annotations" / "instances_val.json"
    coco = json.loads(ann.read_text())
    first, second = coco["images"][0], coco["images"][1]
    assert first["width"] == 251
    first["width"] *= 10  # DALI would make this image's boxes 10x too small
    (root / "val" / second["file_name"]).unlink()
    ann.write_text(json.dumps(coco))
    with pytest.raises(DataError, match=rf"(?s){first['file_name']} is 251x251.*scaled by 0\.1 x 1.*{second['file_name']}"):
        resolve_detection_source(root, "val")
    report = check_data(root, splits=["val"], device="cpu")
    codes = sorted(p.code for p in report.errors)
    assert codes == ["missing-file", "size-mismatch"]
    _, exclude = report.write(tmp_path / "check")
    source = resolve_detection_source(root, "val", exclude=exclude)
    assert source.num_images_total == len(coco["images"]) - 2
    kept = json.loads(source.annotations_file.read_text())
    assert {im["id"] for im in kept["images"]} == {im["id"] for im in coco["images"][2:]}


def test_cache_makes_a_second_check_skip_unchanged_files(tmp_path, tiny_classification, monkeypatch):
    import crossdali.common.data.check.core as core
    from tests.conformance.corpus import case_bytes, image_folder

    root = image_folder(tmp_path / "data", tiny_classification, *case_bytes(tiny_classification)["gif"])
    with pytest.raises(DataError, match=r"anim\.jpg is a GIF file"):
        resolve_source(root, "val")
    calls = []
    monkeypatch.setattr(core, "inspect_image", lambda *a, **k: calls.append(a) or pytest.fail("not cached"))
    with pytest.raises(DataError, match=r"anim\.jpg is a GIF file"):  # answered from the cache
        resolve_source(root, "val")
    good = next((root / "val" / "a").glob("*.jpg")).read_bytes()
    (root / "val" / "b" / "anim.jpg").write_bytes(good)  # changed: checked again
    monkeypatch.undo()
    assert resolve_source(root, "val").num_samples == 7


@pytest.mark.parametrize("processes", [0, 2])
def test_unreadable_file_is_named_with_or_without_a_cache(tmp_path, tiny_classification, processes):
    """A file that cannot be opened is reported whether the cache is empty (the header readers take
    each file's signature from the open file) or answers for the other files (stat first)."""
    from crossdali.common.data.check.core import CheckSettings, check_image_files

    good = sorted((tiny_classification / "imagefolder" / "val").rglob("*.jpg"))[:3]
    folder = tmp_path / "files"
    folder.mkdir()
    files = []
    for i, src in enumerate(good):
        shutil.copy(src, folder / f"{i}.jpg")
        files.append(str(folder / f"{i}.jpg"))
    (folder / "gone.jpg").symlink_to(folder / "missing.jpg")  # open() fails, as root too
    files.append(str(folder / "gone.jpg"))
    settings = CheckSettings(cache_dir=str(tmp_path / "cache"), processes=processes)
    for run in ("empty cache", "cache filled by the first run"):
        problems, infos = check_image_files(files, root=folder, settings=settings)
        assert [(p.sample, p.code) for p in problems] == [("gone.jpg", "unreadable")], run
        assert "No such file or directory" in problems[0].message
        assert all(infos[f].format == "JPEG" for f in files[:3]), run
    cached = json.loads(next((tmp_path / "cache").glob("*.json")).read_text())["entries"]
    assert sorted(cached) == sorted(str(folder / f"{i}.jpg") for i in range(3))  # never the unreadable one
    for i in range(3):
        st = (folder / f"{i}.jpg").stat()
        assert cached[str(folder / f"{i}.jpg")]["sig"] == [st.st_size, st.st_mtime_ns]


def test_command_line_writes_report_and_exclusion_list(tmp_path, tiny_classification, capsys):
    from crossdali.common.data.check.__main__ import get_args_parser, main
    from tests.conformance.corpus import case_bytes, image_folder

    cases = case_bytes(tiny_classification)
    root = tmp_path / "data"
    for case in ("truncated", "warning-only", "good"):
        image_folder(root, tiny_classification, *cases[case])
    args = get_args_parser().parse_args([str(root), "--depth", "full", "--device", "cpu", "--out", str(tmp_path / "o"),
                                         "--no-progress"])
    assert main(args) == 1
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["num_samples"] == 9 and report["num_errors"] == 2
    excluded = [ln.split("\t")[0] for ln in (tmp_path / "o" / "exclude.txt").read_text().splitlines()
                if not ln.startswith("#")]
    assert excluded == ["val/b/truncated.jpg", "val/b/warns.jpg"]
    assert resolve_source(root, "val", exclude=tmp_path / "o" / "exclude.txt").num_samples == 7


def test_explain_names_the_file_dali_named_or_finds_it(tmp_path, tiny_classification):
    from crossdali.common.data.sources import explain_files_failure
    from tests.conformance.corpus import case_bytes, image_folder

    named = explain_files_failure(RuntimeError("Error in CPU operator `nvidia.dali.fn.readers.file`\n"
                                               "File mapping failed: /d/x.jpg\nC++ context: [...]"), files=[], where="d")
    assert isinstance(named, DataError) and "/d/x.jpg cannot be read by DALI" in str(named)
    root = image_folder(tmp_path / "data", tiny_classification, *case_bytes(tiny_classification)["bad-huffman"])
    files = sorted(str(p) for p in root.rglob("*.jpg"))
    found = explain_files_failure(RuntimeError("Error in CPU operator `nvidia.dali.fn.decoders.image`\n"
                                               "nvImageCodec failure: '#3'"), files=files, where=str(root))
    assert isinstance(found, DataError) and "badhuff.jpg cannot be decoded" in str(found)
    other = ValueError("not about data")
    assert explain_files_failure(other, files=files, where="x") is other


@pytest.mark.parametrize("mode", ["L", "RGB", "CMYK"])
@pytest.mark.parametrize("progressive", [False, True])
def test_jpeg_header_without_pillow_reads_what_pillow_reads(mode, progressive):
    """Whole JPEGs skip Pillow in the fast pass (the marker walk has format, size and components):
    the answer must be Pillow's, for each component count and for progressive files."""
    import io

    from PIL import Image

    from crossdali.common.data.check.images import inspect_image

    buf = io.BytesIO()
    Image.new(mode, (37, 23), color=(90,) * len(mode)).save(buf, "JPEG", progressive=progressive, quality=80)
    data = buf.getvalue()
    with Image.open(io.BytesIO(data)) as img:
        expected = (img.format, img.width, img.height, img.mode)
    info = inspect_image(data, extension=".jpg")
    assert (info.format, info.width, info.height, info.mode) == expected
    assert info.problems == []
    assert [code for code, _ in inspect_image(data, extension=".png").problems] == ["misnamed"]
    assert [code for code, _ in inspect_image(data[:-200], extension=".jpg").problems] == ["truncated"]


def test_jpeg_walk_refuses_a_scan_the_cpu_decoder_cannot_decode():
    """A table defined between the frame and the scan is legal (accepted); removed, the scan uses an
    undefined table, refused by the fast pass as a scan naming a component the frame lacks is (both
    stop libjpeg-turbo; the GPU decoder was seen to let each through)."""
    import io

    from PIL import Image

    from crossdali.common.data.check.images import inspect_image
    from tests.conformance.corpus import header_segments, patched

    buf = io.BytesIO()
    Image.new("RGB", (37, 23), color=(90, 20, 200)).save(buf, "JPEG", quality=80)
    data = buf.getvalue()
    *header, (_, scan, _) = header_segments(data)

    def joined(keep) -> bytes:  # the header segments whose marker ``keep`` accepts, in file order
        return b"".join(data[a:b] for m, a, b in header if keep(m))

    sof, dqt = joined(lambda m: m == 0xC0), joined(lambda m: m == 0xDB)
    rest = joined(lambda m: m not in (0xC0, 0xDB))
    assert inspect_image(data[:2] + rest + sof + dqt + data[scan:], extension=".jpg").problems == []
    problems = inspect_image(data[:2] + rest + sof + data[scan:], extension=".jpg").problems
    assert [code for code, _ in problems] == ["corrupt"]
    assert "quantization table 0 for component 1" in problems[0][1] and "re-encode" in problems[0][1]
    problems = inspect_image(patched(data, 0xDA, 1, 9), extension=".jpg").problems  # scan component 1 -> 9
    assert [code for code, _ in problems] == ["corrupt"] and "names component 9" in problems[0][1]


def test_the_check_before_training_logs_its_progress(tmp_path, tiny_classification, caplog, monkeypatch):
    """A long first check is not a silent wait: resolve_source's fast pass (what every loader runs before
    training) logs how many samples are done, of how many; here a line per sample (PROGRESS_EVERY_S 0)."""
    import logging

    from crossdali.common.data.check import core

    folder = tmp_path / "data"
    shutil.copytree(tiny_classification / "imagefolder", folder)
    monkeypatch.setattr(core, "PROGRESS_EVERY_S", 0.0)
    with caplog.at_level(logging.INFO, logger="crossdali.common.data.check.core"):
        source = resolve_source(folder, "train")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"checking {folder / 'train'}")]
    assert lines, "no progress line"
    assert f"{source.num_samples:,} of {source.num_samples:,} samples" in lines[-1]
