"""SSD300 detection example (PyTorch): model, loss, COCO mAP and ``python -m crossdali.detection_ssd.train``."""

from crossdali.detection_ssd.model import SSD300, BoxCoder, MultiBoxLoss, postprocess

__all__ = ["SSD300", "BoxCoder", "MultiBoxLoss", "postprocess"]
