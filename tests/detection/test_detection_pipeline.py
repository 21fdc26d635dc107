"""The shared DALI detection pipeline (CPU mode): outputs, geometry recomputed in numpy from the
random parameters DALI exposes, box encoder round trip, bad input."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from crossdali.common.anchors import ssd300_default_boxes
from crossdali.common.classification import PipelineOptions
from crossdali.common.detection import (
    DEBUG_OUTPUTS,
    TRAIN_OUTPUTS,
    VAL_OUTPUTS,
    create_detection_pipeline,
    resolve_detection_source,
)
from crossdali.common.errors import DataError


def _run(pipe, names, iters=1):
    pipe.build()
    batches = []
    for _ in range(iters):
        out = [x.as_cpu() if hasattr(x, "as_cpu") else x for x in pipe.run()]
        batches.append({n: [np.array(x[i]) for i in range(len(x))] for n, x in zip(names, out)})
    return batches


def test_default_boxes():
    boxes = ssd300_default_boxes()
    assert len(boxes) == 8732
    xywh = boxes.xywh()
    assert boxes.ltrb().shape == xywh.shape == (8732, 4) and xywh.min() >= 0 and xywh.max() <= 1
    # first map: 38x38 cells of stride 8 px, first box shape of scale 21/300
    np.testing.assert_allclose(xywh[0], [4 / 300, 4 / 300, 21 / 300, 21 / 300], rtol=1e-5)
    np.testing.assert_allclose(xywh[38 * 38 * 4 - 1, :2], [(37.5) / 37.5, (37.5) / 37.5], rtol=1e-5)


def test_train_geometry_matches_numpy(detection_root, expected_crop_boxes):
    src = resolve_detection_source(detection_root, "train")
    pipe = create_detection_pipeline(src, train=True, options=PipelineOptions(batch_size=16, num_threads=2, seed=3),
                                     debug=True)
    batches = _run(pipe, TRAIN_OUTPUTS + DEBUG_OUTPUTS, iters=3)
    ratios, flips, dropped, cropped = [], [], 0, 0
    for batch in batches:
        for i in range(len(batch["images"])):
            raw_labels = batch["raw_labels"][i]
            n_raw = int((raw_labels > 0).sum())
            raw = batch["raw_boxes"][i][:n_raw]
            assert raw.min() >= 0 and raw.max() <= 1
            ratio, px, py = float(batch["ratio"][i]), float(batch["paste_x"][i]), float(batch["paste_y"][i])
            anchor, shape, flip = batch["crop_anchor"][i], batch["crop_shape"][i], int(batch["flip"][i])
            assert 1.0 <= ratio <= 4.0 and 0 <= px <= 1 and 0 <= py <= 1
            expected, keep = expected_crop_boxes(raw, ratio, px, py, anchor, shape, flip)
            labels = batch["crop_labels"][i]
            n = int((labels > 0).sum())
            got = batch["crop_boxes"][i][:n]
            assert n == len(expected), f"sample {i}: {n} boxes kept, numpy keeps {len(expected)}"
            np.testing.assert_allclose(got, expected, atol=2e-5)
            np.testing.assert_array_equal(labels[:n], raw_labels[:n_raw][keep])
            assert got.size == 0 or (got.min() >= 0 and got.max() <= 1)
            ratios.append(ratio)
            flips.append(flip)
            dropped += n_raw - n
            cropped += bool(shape.min() < 1)
            assert batch["images"][i].shape == (3, 300, 300)
            assert batch["boxes"][i].shape == (8732, 4) and batch["labels"][i].shape == (8732,)
    # the random parameters really vary: both zoom-out and no zoom-out, both flips, real crops
    assert min(ratios) == 1.0 and max(ratios) > 1.5
    assert 0 < sum(flips) < len(flips)
    assert cropped > 0 and dropped > 0


def test_box_encoder_round_trip(detection_root):
    """DALI encodes, crossdali's BoxCoder decodes: matched anchors give back their ground-truth boxes,
    and BoxCoder.encode (the native path) assigns exactly the same labels as DALI."""
    torch = pytest.importorskip("torch")
    from crossdali.pytorch.boxes import BoxCoder

    src = resolve_detection_source(detection_root, "train")
    pipe = create_detection_pipeline(src, train=True, options=PipelineOptions(batch_size=16, num_threads=2, seed=5),
                                     debug=True)
    (batch,) = _run(pipe, TRAIN_OUTPUTS + DEBUG_OUTPUTS)
    coder = BoxCoder()
    matched_total = 0
    for i in range(16):
        n = int((batch["crop_labels"][i] > 0).sum())
        gt = torch.from_numpy(batch["crop_boxes"][i][:n])
        gt_labels = torch.from_numpy(batch["crop_labels"][i][:n]).long()
        labels = torch.from_numpy(batch["labels"][i])
        decoded = coder.decode(torch.from_numpy(batch["boxes"][i]))
        pos = labels > 0
        matched_total += int(pos.sum())
        if n == 0:
            assert not pos.any()
            continue
        # every positive anchor decodes to one of the ground-truth boxes, with that box's label
        dist = (decoded[pos, None, :] - gt[None]).abs().amax(dim=2)  # (P, n)
        best = dist.argmin(dim=1)
        assert float(dist.min(dim=1).values.max()) < 1e-4
        assert torch.equal(labels[pos], gt_labels[best])
        # every ground-truth box is matched by at least one anchor
        assert set(best.tolist()) == set(range(n))
        _, native_labels = coder.encode(gt, gt_labels)
        assert torch.equal(native_labels, labels), f"sample {i}: BoxCoder.encode disagrees with DALI's box_encoder"
    assert matched_total > 0


def test_val_outputs_keep_boxes_and_ids(detection_root):
    src = resolve_detection_source(detection_root, "val")
    assert not src.skip_empty
    coco = json.loads(src.annotations_file.read_text())
    pipe = create_detection_pipeline(src, train=False, options=PipelineOptions(batch_size=8, num_threads=2))
    (batch,) = _run(pipe, VAL_OUTPUTS)
    to_label = {cid: i + 1 for i, (cid, _) in enumerate(src.categories)}
    images = {im["id"]: im for im in coco["images"]}
    for i in range(8):
        image_id = int(batch["image_ids"][i].reshape(-1)[0])
        im = images[image_id]
        anns = [a for a in coco["annotations"] if a["image_id"] == image_id]
        expected = np.array([[a["bbox"][0] / im["width"], a["bbox"][1] / im["height"],
                              (a["bbox"][0] + a["bbox"][2]) / im["width"], (a["bbox"][1] + a["bbox"][3]) / im["height"]]
                             for a in anns])
        n = len(anns)
        np.testing.assert_allclose(batch["boxes"][i][:n], expected, atol=1e-6)
        assert batch["labels"][i][:n].tolist() == [to_label[a["category_id"]] for a in anns]
        assert (batch["labels"][i][n:] == 0).all()
        assert batch["images"][i].shape == (3, 300, 300)


def test_category_ids_map_in_file_order(detection_root, tmp_path):
    """DALI numbers categories 1..C in the annotation file's order; the source's mapping must agree."""
    root = tmp_path / "ds"
    shutil.copytree(detection_root / "val", root / "val")
    coco = json.loads((detection_root / "annotations" / "instances_val.json").read_text())
    coco["categories"] = coco["categories"][::-1]
    (root / "annotations").mkdir()
    (root / "annotations" / "instances_val.json").write_text(json.dumps(coco))
    src = resolve_detection_source(root, "val")
    assert src.categories[0][0] == coco["categories"][0]["id"]
    pipe = create_detection_pipeline(src, train=False, options=PipelineOptions(batch_size=4, num_threads=1))
    (batch,) = _run(pipe, VAL_OUTPUTS)
    to_cat = src.label_to_category
    for i in range(4):
        image_id = int(batch["image_ids"][i].reshape(-1)[0])
        cats = [a["category_id"] for a in coco["annotations"] if a["image_id"] == image_id]
        labels = [int(v) for v in batch["labels"][i] if v > 0]
        assert [to_cat[v] for v in labels] == cats


# ---- bad input: clear errors naming the entry ----

def _copy(detection_root, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(detection_root / "val", root / "val")
    (root / "annotations").mkdir()
    coco = json.loads((detection_root / "annotations" / "instances_val.json").read_text())
    return root, coco


def test_missing_annotation_file(tmp_path):
    (tmp_path / "val").mkdir()
    with pytest.raises(DataError, match=r"instances_val\.json"):
        resolve_detection_source(tmp_path, "val")


def test_malformed_annotation_file(detection_root, tmp_path):
    root, _ = _copy(detection_root, tmp_path)
    (root / "annotations" / "instances_val.json").write_text('{"images": [')
    with pytest.raises(DataError, match="not valid JSON"):
        resolve_detection_source(root, "val")
    (root / "annotations" / "instances_val.json").write_text('{"images": []}')
    with pytest.raises(DataError, match="not COCO format"):
        resolve_detection_source(root, "val")


def test_box_outside_image(detection_root, tmp_path):
    root, coco = _copy(detection_root, tmp_path)
    ann = coco["annotations"][3]
    im = next(i for i in coco["images"] if i["id"] == ann["image_id"])
    ann["bbox"] = [im["width"] - 10, 5, 40, 20]
    (root / "annotations" / "instances_val.json").write_text(json.dumps(coco))
    with pytest.raises(DataError, match=rf"outside its image {im['file_name']}.*\"id\": {ann['id']}"):
        resolve_detection_source(root, "val")


def test_image_without_file(detection_root, tmp_path):
    root, coco = _copy(detection_root, tmp_path)
    name = coco["images"][2]["file_name"]
    (root / "val" / name).unlink()
    (root / "annotations" / "instances_val.json").write_text(json.dumps(coco))
    with pytest.raises(DataError, match=rf"image id {coco['images'][2]['id']} has no file .*{name}"):
        resolve_detection_source(root, "val")


def test_annotation_for_unknown_image_or_category(detection_root, tmp_path):
    root, coco = _copy(detection_root, tmp_path)
    coco["annotations"][0]["category_id"] = 999
    (root / "annotations" / "instances_val.json").write_text(json.dumps(coco))
    with pytest.raises(DataError, match="category id 999"):
        resolve_detection_source(root, "val")
    coco["annotations"][0]["category_id"] = coco["categories"][0]["id"]
    coco["annotations"][0]["image_id"] = 123456
    (root / "annotations" / "instances_val.json").write_text(json.dumps(coco))
    with pytest.raises(DataError, match="image id 123456"):
        resolve_detection_source(root, "val")


@pytest.mark.parametrize("device,canvas_free", [
    ("cpu", True), ("cpu", False),
    pytest.param("gpu", True, marks=pytest.mark.gpu), pytest.param("gpu", False, marks=pytest.mark.gpu)])
def test_train_image_lands_where_its_boxes_do(detection_root, device, canvas_free):
    """The zoomed-out, cropped image's pixels: outside the image's place in the window (from the
    random parameters, as for the boxes) every pixel is the fill colour; inside, the photo. With the
    canvas and without it (the default; on the GPU a padded slice of the window), on the CPU and the GPU."""
    from crossdali.common.detection import DetectionTransform

    same = (1.0, 1.0 + 1e-6)  # no colour jitter (DALI's uniform needs a non-empty range)
    t = DetectionTransform(hue_degrees=1e-6, saturation=same, brightness=same, contrast=same, flip_probability=0.0,
                           canvas_free=canvas_free)
    fill = (np.array(t.fill, np.float64) - t.mean) / t.std
    canvas = not canvas_free
    src = resolve_detection_source(detection_root, "train")
    options = PipelineOptions(batch_size=16, num_threads=2, seed=7, device=device,
                              device_id=0 if device == "gpu" else None)
    pipe = create_detection_pipeline(src, train=True, options=options, transform=t, debug=True)
    zoomed = misses = 0
    for batch in _run(pipe, TRAIN_OUTPUTS + DEBUG_OUTPUTS, iters=4):
        for i, img in enumerate(batch["images"]):
            ratio, px, py = float(batch["ratio"][i]), float(batch["paste_x"][i]), float(batch["paste_y"][i])
            anchor, shape = batch["crop_anchor"][i].astype(np.float64), batch["crop_shape"][i].astype(np.float64)
            lo = (np.array([px, py]) * (1 - 1 / ratio) - anchor) / shape * 300  # the image's corners in the output
            hi = lo + 300 / ratio / shape
            is_fill = np.all(np.abs(img - fill[:, None, None]) < 1e-3, axis=0)  # (H, W)
            ys, xs = np.mgrid[0:300, 0:300] + 0.5
            # resizing the canvas's crop (or on the GPU the padded window, as without it) blends the photo's edge
            # into the fill
            m = 2 if canvas or device == "gpu" else 1
            outside = (xs < lo[0] - m) | (xs > hi[0] + m) | (ys < lo[1] - m) | (ys > hi[1] + m)
            inside = (xs > lo[0] + 1) & (xs < hi[0] - 1) & (ys > lo[1] + 1) & (ys < hi[1] - 1)
            assert is_fill[outside].all(), f"sample {i}: photo pixels outside the image's place"
            if inside.sum() > 100:
                assert is_fill[inside].mean() < 0.5, f"sample {i}: fill colour where the photo should be"
            else:
                misses += 1
            zoomed += ratio > 1.5 and outside.any()
    assert zoomed > 0


def test_gpu_canvas_free_spelling_matches_the_canvas(detection_root):
    """The GPU's canvas-free spelling (the crop window read from the decoded image by one padded slice, then the
    resize) gives the pixels of paste -> slice -> resize up to the rounding of the window's corner; the same DALI
    operators run on the CPU here, on the same random draws."""
    from nvidia.dali import fn, pipeline_def, types

    from crossdali.common.detection import DetectionTransform, _padded_crop_resize

    t = DetectionTransform()
    src = resolve_detection_source(detection_root, "train")

    @pipeline_def(batch_size=16, num_threads=2, device_id=None, seed=11)
    def both():
        jpegs, boxes, labels = fn.readers.coco(file_root=str(src.file_root), annotations_file=str(src.annotations_file),
                                               ltrb=True, ratio=True)
        images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
        ratio = fn.random.uniform(range=[1.0, t.max_zoom_out])
        px, py = fn.random.uniform(range=[0.0, 1.0]), fn.random.uniform(range=[0.0, 1.0])
        boxes = fn.bbox_paste(boxes, ratio=ratio, paste_x=px, paste_y=py, ltrb=True)
        anchor, shape, _, _ = fn.random_bbox_crop(boxes, labels, thresholds=list(t.iou_thresholds),
                                                  scaling=list(t.crop_scaling), aspect_ratio=list(t.crop_aspect_ratio),
                                                  bbox_layout="xyXY", allow_no_crop=True, num_attempts=50)
        canvas = fn.paste(images, ratio=ratio, paste_x=px, paste_y=py, fill_value=t.fill)
        canvas = fn.slice(canvas, anchor, shape, axis_names="WH", out_of_bounds_policy="trim_to_shape")
        canvas = fn.resize(canvas, resize_x=300, resize_y=300, min_filter=types.INTERP_TRIANGULAR)
        return canvas, _padded_crop_resize(images, ratio, px, py, anchor, shape, size=300, fill=t.fill)

    pipe = both()
    pipe.build()
    fill = np.array(t.fill)
    for _ in range(3):
        canvas, padded = pipe.run()
        for a, b in zip(canvas, padded):
            a, b = np.asarray(a), np.asarray(b)
            assert a.shape == b.shape == (300, 300, 3)
            # where the photo lands: its bounding box in the output, the same up to a pixel of rounding
            boxes = []
            for img in (a, b):
                ys, xs = np.where(~np.all(img == fill, axis=2))
                boxes.append(np.array([xs.min(), xs.max(), ys.min(), ys.max()]))
            assert np.abs(boxes[0] - boxes[1]).max() <= 2, boxes
            # and the same part of the photo: a shift under a source pixel (magnified by the resize) moves texture
            # by a few output pixels, not the colours of the crop
            assert np.abs(a.reshape(-1, 3).mean(0) - b.reshape(-1, 3).mean(0)).max() < 3
