"""SSD300 on a torchvision ResNet, its loss and post-processing (``BoxCoder``, which inverts DALI's
``box_encoder``, lives in ``crossdali.pytorch.boxes``: the native detection loader uses it too).

The architecture is NVIDIA's SSD300 v1.1 (DeepLearningExamples): ResNet up to ``layer3`` with
that stage's stride set to 1 (38x38 features), five extra blocks down to 1x1, and a 3x3 conv
head per feature map. Regression targets are the (dx, dy, dw, dh) offsets that DALI's
``box_encoder(offset=True, stds=BOX_CODER_STDS)`` writes, so the loss takes DALI's output as is.
"""

from __future__ import annotations

import torch
import torchvision
from torch import nn

from crossdali.common.anchors import DefaultBoxes, ssd300_default_boxes
from crossdali.pytorch.boxes import BoxCoder

__all__ = ["SSD300", "MultiBoxLoss", "BoxCoder", "postprocess"]


class _Backbone(nn.Module):
    def __init__(self, arch: str) -> None:
        super().__init__()
        try:
            net = torchvision.models.get_model(arch, weights=None)
        except ValueError as e:
            raise ValueError(f"--arch {arch!r} is not a torchvision model name ({e}); use resnet18/34/50/101") from e
        if not isinstance(net, torchvision.models.ResNet):
            raise ValueError(f"SSD300 here needs a torchvision ResNet backbone, got {arch!r}")
        self.features = nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool, net.layer1, net.layer2, net.layer3)
        block = net.layer3[0]  # stride 1 in layer3: 38x38 features from a 300x300 image
        for conv in (block.conv1, block.conv2, block.downsample[0]):
            conv.stride = (1, 1)
        self.out_channels = net.layer3[-1].conv2.out_channels if isinstance(block, torchvision.models.resnet.BasicBlock) \
            else net.layer3[-1].conv3.out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)


class SSD300(nn.Module):
    """Returns ``(locs, scores)``: ``(N, 4, 8732)`` regression offsets and ``(N, classes + 1, 8732)`` logits."""

    def __init__(self, num_classes: int, *, arch: str = "resnet50", boxes: DefaultBoxes | None = None) -> None:
        super().__init__()
        self.boxes = boxes or ssd300_default_boxes()
        self.num_labels = num_classes + 1  # + background
        self.backbone = _Backbone(arch)
        channels = [self.backbone.out_channels, 512, 512, 256, 256, 256]
        blocks = []
        for i, (cin, cout, mid) in enumerate(zip(channels[:-1], channels[1:], (256, 256, 128, 128, 128))):
            down = dict(kernel_size=3, padding=1, stride=2) if i < 3 else dict(kernel_size=3)
            blocks.append(nn.Sequential(
                nn.Conv2d(cin, mid, kernel_size=1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(inplace=True),
                nn.Conv2d(mid, cout, bias=False, **down), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)))
        self.extra = nn.ModuleList(blocks)
        nd = self.boxes.boxes_per_cell
        self.loc = nn.ModuleList(nn.Conv2d(c, n * 4, kernel_size=3, padding=1) for c, n in zip(channels, nd))
        self.conf = nn.ModuleList(nn.Conv2d(c, n * self.num_labels, kernel_size=3, padding=1) for c, n in zip(channels, nd))
        for m in [*self.extra.modules(), *self.loc, *self.conf]:
            if isinstance(m, nn.Conv2d):
                nn.init.xavier_uniform_(m.weight)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        feats = [self.backbone(x)]
        for block in self.extra:
            feats.append(block(feats[-1]))
        n = x.shape[0]
        # (N, boxes_per_cell * 4, H, W) -> (N, 4, boxes_per_cell * H * W): the anchors' order
        locs = torch.cat([head(f).view(n, 4, -1) for head, f in zip(self.loc, feats)], dim=2)
        scores = torch.cat([head(f).view(n, self.num_labels, -1) for head, f in zip(self.conf, feats)], dim=2)
        return locs.contiguous(), scores.contiguous()


class MultiBoxLoss(nn.Module):
    """Smooth-L1 on matched anchors + cross-entropy with 3:1 hard-negative mining, per positive."""

    def forward(self, locs: torch.Tensor, scores: torch.Tensor, gt_offsets: torch.Tensor,
                gt_labels: torch.Tensor) -> torch.Tensor:
        # locs (N, 4, A), scores (N, C, A); DALI gives gt_offsets (N, A, 4), gt_labels (N, A)
        mask = gt_labels > 0
        pos = mask.sum(dim=1)
        sl1 = nn.functional.smooth_l1_loss(locs.float(), gt_offsets.transpose(1, 2).float(), reduction="none").sum(dim=1)
        sl1 = (sl1 * mask).sum(dim=1)
        con = nn.functional.cross_entropy(scores.float(), gt_labels, reduction="none")
        con_neg = con.clone()
        con_neg[mask] = 0
        rank = con_neg.argsort(dim=1, descending=True).argsort(dim=1)
        neg = rank < torch.clamp(3 * pos, max=mask.shape[1]).unsqueeze(-1)
        closs = (con * (mask | neg)).sum(dim=1)
        has_pos = (pos > 0).float()
        return ((sl1 + closs) * has_pos / pos.float().clamp(min=1e-6)).mean()


@torch.no_grad()
def postprocess(locs: torch.Tensor, scores: torch.Tensor, coder: BoxCoder, *, score_threshold: float = 0.05,
                iou_threshold: float = 0.5, max_candidates: int = 1000, max_detections: int = 200):
    """Per image ``(boxes (K, 4) ltrb relative, scores (K,), labels (K,) in 1..C)`` after class-wise NMS."""
    boxes = coder.decode(locs.transpose(1, 2)).clamp(0, 1)  # (N, A, 4)
    probs = torch.softmax(scores.float(), dim=1)[:, 1:]  # (N, C, A), background dropped
    results = []
    for b, p in zip(boxes, probs):
        num_classes, num_anchors = p.shape
        flat = p.reshape(-1)
        keep = torch.nonzero(flat > score_threshold).squeeze(1)
        if keep.numel() > max_candidates:
            keep = keep[flat[keep].topk(max_candidates).indices]
        cls, anchor = keep // num_anchors, keep % num_anchors
        cand_boxes, cand_scores = b[anchor], flat[keep]
        kept = torchvision.ops.batched_nms(cand_boxes, cand_scores, cls, iou_threshold)[:max_detections]
        results.append((cand_boxes[kept], cand_scores[kept], cls[kept] + 1))
    return results
