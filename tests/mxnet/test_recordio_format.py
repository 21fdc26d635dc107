"""The hand-written RecordIO of ``crossdali.common.data.sample_data.formats`` read back by MXNet's own
reader: proves the format (record framing, IRHeader, .idx) without MXNet in the other envs."""

from __future__ import annotations

from pathlib import Path

import pytest

mx = pytest.importorskip("mxnet")

from crossdali.common.data.sample_data.formats import write_recordio  # noqa: E402
from crossdali.common.data.sources import resolve_source  # noqa: E402

pytestmark = pytest.mark.mxnet


@pytest.mark.parametrize("split", ["train", "val"])
def test_sample_recordio_reads_back_with_mxnet(tiny_classification, split):
    folder = tiny_classification / "recordio"
    reference = resolve_source(tiny_classification / "imagefolder", split)
    rec = mx.recordio.MXIndexedRecordIO(str(folder / f"{split}.idx"), str(folder / f"{split}.rec"), "r")
    try:
        assert sorted(rec.keys) == list(range(reference.num_samples))
        for i in (0, 1, reference.num_samples // 2, reference.num_samples - 1):  # random access via .idx
            header, jpeg = mx.recordio.unpack(rec.read_idx(i))
            assert header.flag == 0 and header.id == i and header.id2 == 0
            assert header.label == float(reference.labels[i])
            assert jpeg == Path(reference.files[i]).read_bytes()  # the very bytes of the ImageFolder JPEG
    finally:
        rec.close()


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 1000])
def test_record_padding_for_every_length_mod_4(tmp_path, size):
    """dmlc pads each record to 4 bytes; payload lengths of every residue must round-trip."""
    samples = [(bytes([i % 251]) * (size + i), i) for i in range(4)]
    write_recordio(tmp_path / "x.rec", samples)
    rec = mx.recordio.MXRecordIO(str(tmp_path / "x.rec"), "r")
    try:
        for payload, label in samples:
            header, data = mx.recordio.unpack(rec.read())
            assert (header.label, data) == (float(label), payload)
        assert rec.read() is None  # nothing after the last record
    finally:
        rec.close()


def test_mxnet_written_recordio_is_read_by_dali(tmp_path, tiny_classification):
    """The other direction: a .rec written by mxnet.recordio (as im2rec.py does) feeds our pipeline."""
    from crossdali.mxnet import create_classification_loader

    reference = resolve_source(tiny_classification / "imagefolder", "val")
    rec = mx.recordio.MXIndexedRecordIO(str(tmp_path / "val.idx"), str(tmp_path / "val.rec"), "w")
    for i, (path, label) in enumerate(zip(reference.files, reference.labels)):
        rec.write_idx(i, mx.recordio.pack(mx.recordio.IRHeader(0, float(label), i, 0), Path(path).read_bytes()))
    rec.close()
    it = create_classification_loader(tmp_path, train=False, batch_size=16, crop_size=32, workers=1)
    labels = [int(v) for b in it for v in b.label[0].asnumpy()[: 16 - b.pad]]
    assert labels == list(reference.labels)
