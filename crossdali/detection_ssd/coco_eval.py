"""COCO box mAP with pycocotools, from detections in relative ltrb coordinates."""

from __future__ import annotations

import contextlib
import io
import logging

from crossdali.common.detection import DetectionSource

__all__ = ["to_coco_results", "coco_map"]

log = logging.getLogger(__name__)


def to_coco_results(source: DetectionSource, image_ids, detections) -> list[dict]:
    """pycocotools' result records: pixel ``[x, y, w, h]``, COCO category ids (not training labels)."""
    to_cat = source.label_to_category
    records = []
    for image_id, (boxes, scores, labels) in zip(image_ids, detections):
        image_id = int(image_id)
        w, h = source.image_sizes[image_id]
        for (x0, y0, x1, y1), s, c in zip(boxes.tolist(), scores.tolist(), labels.tolist()):
            records.append({"image_id": image_id, "category_id": to_cat[int(c)],
                            "bbox": [x0 * w, y0 * h, (x1 - x0) * w, (y1 - y0) * h], "score": float(s)})
    return records


def coco_map(source: DetectionSource, records: list[dict], image_ids: list[int] | None = None) -> dict[str, float]:
    """``{"map": AP@[.5:.95], "map50": AP@.5, "map75": AP@.75}`` over ``image_ids`` (default: all)."""
    try:
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval
    except ImportError:
        raise ImportError("COCO mAP needs pycocotools: pip install pycocotools==2.0.11") from None
    quiet = io.StringIO()
    with contextlib.redirect_stdout(quiet):
        gt = COCO(str(source.annotations_file))
        if not records:
            return {"map": 0.0, "map50": 0.0, "map75": 0.0}
        dt = gt.loadRes(records)
        ev = COCOeval(gt, dt, "bbox")
        if image_ids is not None:
            ev.params.imgIds = sorted({int(i) for i in image_ids})
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    log.debug(quiet.getvalue())
    stats = [max(0.0, float(v)) for v in ev.stats[:3]]  # -1 means "no ground truth": report 0
    return {"map": stats[0], "map50": stats[1], "map75": stats[2]}
