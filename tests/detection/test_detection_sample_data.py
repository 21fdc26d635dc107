"""The detection sample set: COCO JSON whose boxes are exactly the pasted photos."""

from __future__ import annotations

import json
from itertools import combinations

import numpy as np
from PIL import Image

from crossdali.common.data.sample_data.detection import CATEGORIES, DETECTION_SIZES, _make_image
from crossdali.common.data.sample_data.photos import load_photo


def test_boxes_are_the_pasted_photos(detection_root):
    coco = json.loads((detection_root / "annotations" / "instances_train.json").read_text())
    photo_of = {cid: photo for cid, _, photo in CATEGORIES}
    assert [c["id"] for c in coco["categories"]] == [1, 3, 5, 8, 13]
    by_image = {}
    for a in coco["annotations"]:
        by_image.setdefault(a["image_id"], []).append(a)
    assert len(by_image) == len(coco["images"]) == 96  # every image has objects
    assert max(len(v) for v in by_image.values()) >= 3
    assert sum(len({a["category_id"] for a in v}) > 1 for v in by_image.values()) > 20  # several categories
    for im in coco["images"][:12]:
        img = np.asarray(Image.open(detection_root / "train" / im["file_name"]).convert("RGB"), dtype=np.float32)
        assert img.shape[:2] == (im["height"], im["width"])
        anns = by_image[im["id"]]
        for a, b in combinations(anns, 2):  # no occlusion: boxes are exact
            (x0, y0, w0, h0), (x1, y1, w1, h1) = a["bbox"], b["bbox"]
            assert x0 + w0 <= x1 or x1 + w1 <= x0 or y0 + h0 <= y1 or y1 + h1 <= y0
        for a in anns:
            x, y, w, h = a["bbox"]
            crop = img[y : y + h, x : x + w]
            photo = np.asarray(Image.fromarray(load_photo(photo_of[a["category_id"]])).resize((w, h), Image.BILINEAR),
                               dtype=np.float32)
            # the same photo up to the image-wide colour gain (0.9-1.1) and JPEG loss: strongly correlated
            corr = np.corrcoef(crop.ravel(), photo.ravel())[0, 1]
            assert corr > 0.8, (im["file_name"], a["id"], corr)
            # and a box one object-width to the side is not that photo
            shifted = img[y : y + h, max(0, x - w) : max(0, x - w) + w]
            if shifted.shape == crop.shape and x >= w:
                assert np.corrcoef(shifted.ravel(), photo.ravel())[0, 1] < corr


def test_deterministic():
    cfg = DETECTION_SIZES["tiny"]
    assert _make_image((0, 5), cfg) == _make_image((0, 5), cfg)
    assert _make_image((0, 5), cfg)[0] != _make_image((0, 6), cfg)[0]
