"""Images that are not JPEGs (PNG, 16-bit PNG, grayscale PNG) in an ImageFolder decode in every
framework and backend, train and val: the fast check accepts them, so every loader must too
(TensorFlow's ``native`` once decoded everything as JPEG and stopped on the first PNG mid-epoch)."""

from __future__ import annotations

import io

import numpy as np
import pytest

from tests.conformance.corpus import image_folder

FRAMEWORKS = {"pytorch": "torch", "tensorflow": "tensorflow", "mxnet": "mxnet"}


def _pngs(tiny) -> dict[str, bytes]:
    from PIL import Image

    src = sorted((tiny / "imagefolder" / "val" / "astronaut").glob("*.jpg"))[0]
    img = Image.open(src).convert("RGB")

    def png(im) -> bytes:
        out = io.BytesIO()
        im.save(out, "PNG")
        return out.getvalue()

    deep = Image.fromarray(np.asarray(img.convert("L"), dtype=np.uint16) * 257)
    return {"rgb.png": png(img), "gray.png": png(img.convert("L")), "deep.png": png(deep)}


def _images(framework: str, root, *, backend: str, train: bool) -> np.ndarray:
    module = __import__(f"crossdali.{framework}", fromlist=["create_classification_loader"])
    kw = dict(train=train, backend=backend, batch_size=4, crop_size=32, workers=1)
    loader = module.create_classification_loader(root, **kw)
    if framework == "mxnet":
        batches = [b.data[0].asnumpy()[: b.data[0].shape[0] - b.pad] for b in loader]
    else:
        batches = [np.asarray(x) for x, _ in loader]  # one epoch, train or val
    return np.concatenate(batches)


@pytest.mark.parametrize("train", [False, True], ids=["val", "train"])
@pytest.mark.parametrize("backend", ["dali-cpu", "native"])
@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_png_decodes_in_every_backend(framework, backend, train, tiny_classification, tmp_path, monkeypatch):
    pytest.importorskip(FRAMEWORKS[framework])
    if framework == "mxnet" and backend == "native":
        pytest.skip("MXNet's native backend (mx.io.ImageRecordIter) reads RecordIO only, not an ImageFolder")
    monkeypatch.setenv("CROSSDALI_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "data"
    for name, data in _pngs(tiny_classification).items():
        image_folder(root, tiny_classification, name, data)
    if train:  # the train split: the same folder
        (root / "train").symlink_to(root / "val", target_is_directory=True)
    images = _images(framework, root, backend=backend, train=train)
    assert images.shape[0] == 9 and np.isfinite(images.astype(np.float32)).all()
    assert images.astype(np.float32).std() > 0  # real pixels, not a constant fill
