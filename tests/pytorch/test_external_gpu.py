"""GPU paths of the external-source loader and of inference (mixed decoder, outputs on CUDA).

Skipped where no CUDA GPU is visible; the lead runs them on the H100.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

from crossdali.common.data.sources import resolve_source  # noqa: E402
from crossdali.common.distributed import DistInfo  # noqa: E402
from crossdali.common.inference import prepare_image  # noqa: E402
from crossdali.pytorch import create_classification_loader  # noqa: E402
from crossdali.pytorch.external import ExternalSourceOptions, create_external_source_loader  # noqa: E402
from crossdali.pytorch.predict import Predictor  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (DALI mixed decoder)"),
]
CROP = 64



@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "parallel"])
def test_external_loader_on_the_gpu_every_sample_once(val_items, parallel, assert_epoch_coverage):
    torch.zeros(1, device="cuda")  # a CUDA context exists: py_start_method='auto' must pick spawn
    feed = ExternalSourceOptions(parallel=parallel, py_workers=2)
    seen = []
    for rank in range(2):
        loader = create_external_source_loader(val_items, train=False, backend="dali-gpu", batch_size=8, crop_size=CROP,
                                               num_classes=55, workers=2, feed=feed,
                                               dist=DistInfo(rank=rank, world_size=2))
        batches = list(loader)
        assert all(x.is_cuda and y.is_cuda and x.shape[1:] == (3, CROP, CROP) for x, y in batches)
        seen.append([i for _, y in batches for i in y.tolist()])
    assert_epoch_coverage(seen, 55)


def test_external_gpu_val_equals_the_gpu_file_reader(val_items, indexed_val_source):
    ext = create_external_source_loader(val_items, train=False, backend="dali-gpu", batch_size=8, crop_size=CROP,
                                        num_classes=55, workers=2)
    ref = create_classification_loader(indexed_val_source, train=False, backend="dali-gpu", batch_size=8,
                                       crop_size=CROP, workers=2)
    for (a, la), (b, lb) in zip(ext, ref, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_channels_last_on_the_gpu_is_the_default_batch_for_external_and_multilabel(val_items, data_root):
    """``channels_last`` on CUDA (the script's ``--channels-last``): the external-source and multi-label
    loaders hand out the NCHW view of DALI's NHWC output, the same values as their default batches,
    the external loader's trimmed last batch included."""
    from crossdali.common.data.sample_data import ensure_multilabel
    from crossdali.common.multilabel import read_multilabel_list
    from crossdali.pytorch.multilabel import create_multilabel_loader

    kw = dict(train=False, backend="dali-gpu", batch_size=8, crop_size=CROP, num_classes=55, workers=2)
    plain = list(create_external_source_loader(val_items, **kw))
    last = list(create_external_source_loader(val_items, channels_last=True, **kw))
    assert [x.shape[0] for x, _ in last] == [8] * 6 + [7]
    lists = read_multilabel_list(ensure_multilabel(data_root, "tiny") / "val.txt")
    kw = dict(train=False, backend="dali-gpu", batch_size=16, crop_size=CROP, workers=2, py_workers=1)
    plain += list(create_multilabel_loader(lists, **kw))
    last += list(create_multilabel_loader(lists, channels_last=True, **kw))
    assert len(last) == len(plain) == 7 + 3
    for (a, la), (b, lb) in zip(plain, last, strict=True):
        assert b.is_cuda and b.is_contiguous(memory_format=torch.channels_last) and not b.is_contiguous()
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_squirrel_store_on_the_gpu_in_spawned_workers(tiny_classification, tmp_path):
    """The store as shards, read by 3 spawned DALI workers (CUDA is up): every sample once per
    epoch, and the same bits as reading the shards in this process."""
    pytest.importorskip("squirrel")
    from crossdali.common.squirrel import SquirrelSource, write_squirrel_store

    torch.zeros(1, device="cuda")
    val = resolve_source(tiny_classification / "imagefolder", "val")
    write_squirrel_store(val, tmp_path / "store", samples_per_shard=8)
    source = SquirrelSource(tmp_path / "store", num_classes=11)

    def loader(**feed):
        return create_external_source_loader(source, train=True, backend="dali-gpu", batch_size=8, crop_size=CROP,
                                             workers=2, seed=7, feed=ExternalSourceOptions(**feed))

    parallel = loader(parallel=True, py_workers=3)
    for _ in range(2):
        labels = [y for x, y in parallel]
        assert sorted(torch.cat(labels).tolist()) == sorted(val.labels)
    for (a, la), (b, lb) in zip(loader(parallel=True, py_workers=3), loader(), strict=True):
        assert a.is_cuda and torch.equal(a, b) and torch.equal(la, lb)


def test_predictor_on_the_gpu_matches_the_cpu_one(tiny_classification, tmp_path):
    """The GPU decoder differs from libjpeg-turbo by a few grey levels; the predictions agree."""
    from PIL import Image

    torch.manual_seed(0)
    model = torchvision.models.get_model("resnet18", weights=None, num_classes=11).eval()
    names = [str(i) for i in range(11)]
    files = list(resolve_source(tiny_classification / "imagefolder", "val").files)[:20]
    Image.open(files[0]).save(tmp_path / "first.gif")
    gpu = Predictor(model, crop_size=CROP, class_names=names, device="cuda", max_batch_size=8)
    cpu = Predictor(model, crop_size=CROP, class_names=names, device="cpu", max_batch_size=8)
    images = [*files, tmp_path / "first.gif"]
    on_gpu, on_cpu = gpu.predict(images, topk=1), cpu.predict(images, topk=1)
    assert on_gpu[-1].converted_from == "a GIF file"
    agree = sum(a.top[0][0] == b.top[0][0] for a, b in zip(on_gpu, on_cpu))
    assert agree >= len(images) - 1, (agree, len(images))
    x = gpu.preprocess([prepare_image(Path(files[0]).read_bytes(), name=files[0])])
    assert x.is_cuda and x.shape == (1, 3, CROP, CROP)
    buf = io.BytesIO()
    Image.open(files[1]).save(buf, "PNG")
    assert gpu.submit(buf.getvalue()).result(60).top
    gpu.close()
