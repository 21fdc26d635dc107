"""SSD box coding in torch: the same maths as DALI's ``box_encoder`` (``crossdali.common.detection``).

The native detection loader encodes its targets with it (so both backends train the same loss),
and the SSD example decodes the model's offsets with it.
"""

from __future__ import annotations

import torch
import torchvision

from crossdali.common.anchors import BOX_CODER_STDS, DefaultBoxes, ssd300_default_boxes

__all__ = ["BoxCoder"]


class BoxCoder:
    """SSD box coding against fixed default boxes, the same maths as DALI's ``box_encoder``."""

    def __init__(self, boxes: DefaultBoxes | None = None, *, match_iou: float = 0.5) -> None:
        boxes = boxes or ssd300_default_boxes()
        self.xywh = torch.from_numpy(boxes.xywh())
        self.ltrb = torch.from_numpy(boxes.ltrb())
        self.stds = torch.tensor(BOX_CODER_STDS)
        self.match_iou = match_iou

    def decode(self, offsets: torch.Tensor) -> torch.Tensor:
        """``(..., A, 4)`` offsets -> ``(..., A, 4)`` ltrb boxes relative to the image."""
        a = self.xywh.to(offsets.device)
        d = offsets.float() * self.stds.to(offsets.device)
        cxcy = d[..., :2] * a[:, 2:] + a[:, :2]
        wh = torch.exp(d[..., 2:]) * a[:, 2:]
        return torch.cat([cxcy - wh / 2, cxcy + wh / 2], dim=-1)

    def encode(self, boxes: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Ground truth ``(M, 4)`` ltrb relative + ``(M,)`` labels -> ``(A, 4)`` offsets, ``(A,)`` labels.

        Each anchor takes the box it overlaps most if that IoU exceeds ``match_iou``; each box also
        claims its best anchor. Unmatched anchors get label 0 and their own box's (zero) offsets.
        """
        a_ltrb, a_xywh = self.ltrb, self.xywh
        matched = a_ltrb.clone()
        out_labels = torch.zeros(len(a_ltrb), dtype=torch.int64)
        if len(boxes):
            iou = torchvision.ops.box_iou(boxes.float(), a_ltrb)  # (M, A)
            best_iou, best_box = iou.max(dim=0)
            # on a tie DALI's box_encoder gives the box the LAST of its best anchors (argmax gives the first)
            best_anchor = iou.shape[1] - 1 - iou.flip(1).argmax(dim=1)
            best_box[best_anchor] = torch.arange(len(boxes))
            best_iou[best_anchor] = 2.0
            keep = best_iou > self.match_iou
            matched[keep] = boxes.float()[best_box[keep]]
            out_labels[keep] = labels.long()[best_box[keep]]
        cxcy = (matched[:, :2] + matched[:, 2:]) / 2
        wh = matched[:, 2:] - matched[:, :2]
        offsets = torch.cat([(cxcy - a_xywh[:, :2]) / a_xywh[:, 2:], torch.log(wh / a_xywh[:, 2:])], dim=1) / self.stds
        return offsets, out_labels
