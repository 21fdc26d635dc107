"""Video examples: clip classification training (``python -m crossdali.video.train``), optical
flow (``python -m crossdali.video.optical_flow``) and a constant-frame-rate VP9 re-encoder
(``python -m crossdali.video.reencode``). The pipelines themselves live in ``crossdali.common.video``."""
