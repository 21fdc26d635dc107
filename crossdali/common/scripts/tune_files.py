"""The settings ``crossdali tune`` wrote (``crossdali.common.tune``): what they are, where they live, read back.

Apart from the tune itself so that the training scripts' defaults (``crossdali.common.scripts.defaults``)
can read a tune file without importing the tuner, which in turn starts from those defaults. A file is
keyed by the resolved data path, backend, batch size, crop size, GPU model and CPU count (docs/tuning.md).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TUNE_VERSION", "KNOBS", "TuneSettings", "Machine", "detect_machine", "tune_dir", "tune_key", "tune_file",
           "read_tune"]

#: bumped whenever what a tune file means changes (older files are then ignored)
TUNE_VERSION = 1
#: the settings searched, in the order the coordinate search visits them
KNOBS = ("workers", "hw_decoder_load", "pipelines", "prefetch")


@dataclass(frozen=True)
class TuneSettings:
    """One configuration of the loader: what a trial measures and what a tune file holds."""

    workers: int  #: DALI CPU threads per pipeline (``-j``)
    hw_decoder_load: float  #: share of JPEGs for the GPU's hardware JPEG decoder (``--hw-decoder-load``)
    pipelines: int  #: DALI pipelines per process (``--pipelines``)
    prefetch: int  #: DALI's ``prefetch_queue_depth``

    def label(self) -> str:
        return f"-j {self.workers}, hw {self.hw_decoder_load:g}, pipelines {self.pipelines}, prefetch {self.prefetch}"


@dataclass(frozen=True)
class Machine:
    """What a tune file is valid for besides the dataset: the GPU model (None: no GPU) and the usable CPUs."""

    gpu: str | None
    hardware_jpeg_decoder: bool
    cpus: int


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def detect_machine() -> Machine:
    """GPU 0's model (``nvidia-smi``, no framework imported) and the CPUs this process may use."""
    from crossdali.common.scripts.info import detect_gpus

    gpus = detect_gpus()
    return Machine(gpu=gpus[0].name if gpus else None, hardware_jpeg_decoder=bool(gpus and gpus[0].hardware_jpeg_decoder),
                   cpus=_cpus())


def tune_dir() -> Path:
    """``$CROSSDALI_CACHE/tune``, default ``~/.cache/crossdali/tune``."""
    env = os.environ.get("CROSSDALI_CACHE")
    return (Path(env) if env else Path.home() / ".cache" / "crossdali") / "tune"


def tune_key(data: Path | str, backend: str, batch_size: int, crop_size: int, machine: Machine) -> dict:
    """What a tune file is for: the resolved data path, backend, batch, crop, GPU model and CPU count."""
    return {"data": str(Path(data).resolve()), "backend": backend, "batch_size": int(batch_size),
            "crop_size": int(crop_size), "gpu": machine.gpu, "cpus": machine.cpus}


def tune_file(key: dict) -> Path:
    """The file of ``key`` under ``tune_dir``: a hash of the key, so one file per dataset and machine setting."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return tune_dir() / f"{digest}.json"


def read_tune(data: Path | str, backend: str, batch_size: int, crop_size: int,
              machine: Machine | None = None) -> tuple[Path, TuneSettings] | None:
    """The tuned settings for this key and their file, or None where ``crossdali tune`` has not written
    any (or the file is unreadable, of another version, or for another key)."""
    if not tune_dir().is_dir():
        return None  # nothing tuned on this machine: no nvidia-smi call
    key = tune_key(data, backend, batch_size, crop_size, machine or detect_machine())
    path = tune_file(key)
    try:
        content = json.loads(path.read_text())
        if content.get("version") != TUNE_VERSION or content.get("key") != key:
            return None
        return path, TuneSettings(**{k: content["settings"][k] for k in KNOBS})
    except (OSError, ValueError, KeyError, TypeError):
        return None
