"""``crossdali info``: what this machine offers crossdali, without importing any framework.

Versions come from package metadata, GPUs from ``nvidia-smi``; the hardware JPEG decoder and the
optical-flow engine are inferred from the GPU model and compute capability (DALI uses the JPEG
engine of A100/A30/H100/H200/B200-class GPUs, and ``fn.optical_flow`` needs Turing or newer).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata

__all__ = ["GpuInfo", "detect_gpus", "print_info", "auto_backend"]

#: GPU name fragments of the models with nvJPEG's hardware decoder (NVIDIA's nvJPEG docs list these).
_HW_JPEG_MODELS = ("A100", "A800", "A30", "H100", "H200", "H800", "H20", "GH200", "B100", "B200", "GB200")
_PACKAGES = {
    "DALI": ("nvidia-dali-cuda130", "nvidia-dali-cuda120", "nvidia-dali-cuda110"),
    "DALI TF plugin": ("nvidia-dali-tf-plugin-cuda130", "nvidia-dali-tf-plugin-cuda120"),
    "PyTorch": ("torch",),
    "torchvision": ("torchvision",),
    "TensorFlow": ("tensorflow", "tensorflow-cpu"),
    "JAX": ("jax",),
    "flax": ("flax",),
    "MXNet": ("mxnet", "mxnet-cu112", "mxnet-cu117"),
    "Horovod": ("horovod",),
    "PyAV": ("av",),
    "pycocotools": ("pycocotools",),
}


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_mib: int
    compute_capability: tuple[int, int] | None
    driver: str

    @property
    def hardware_jpeg_decoder(self) -> bool:
        return any(model in self.name for model in _HW_JPEG_MODELS)

    @property
    def optical_flow_engine(self) -> bool:
        return self.compute_capability is not None and self.compute_capability >= (7, 5)


def _version(names: tuple[str, ...]) -> str | None:
    for name in names:
        try:
            return f"{metadata.version(name)} ({name})"
        except metadata.PackageNotFoundError:
            continue
    return None


def detect_gpus() -> list[GpuInfo]:
    """The NVIDIA GPUs ``nvidia-smi`` lists (an empty list where there is none or no driver)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=index,name,memory.total,compute_cap,driver_version",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    gpus = []
    for line in out.stdout.splitlines() if out.returncode == 0 else []:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5:
            continue
        cc = tuple(int(x) for x in parts[3].split(".")) if parts[3].replace(".", "").isdigit() else None
        gpus.append(GpuInfo(index=int(parts[0]), name=parts[1], memory_mib=int(float(parts[2])),
                            compute_capability=cc, driver=parts[4]))
    return gpus


def auto_backend(gpus: list[GpuInfo]) -> tuple[str, str]:
    """What ``--data-backend auto`` picks on this machine, and why."""
    if gpus:
        hw = "with" if gpus[0].hardware_jpeg_decoder else "without"
        return "dali-gpu", (f"a CUDA GPU is visible ({gpus[0].name}, {hw} a hardware JPEG decoder): DALI decodes "
                            "with the mixed decoder on the GPU (each script checks its framework sees the GPU too)")
    return "dali-cpu", "no CUDA GPU is visible: DALI runs every operator on the CPU (device_id=None)"


def print_info(file=None) -> None:
    file = file or sys.stdout
    from crossdali import __version__
    from crossdali.common.data.sample_data import default_root

    print(f"crossdali {__version__}, Python {sys.version.split()[0]}", file=file)
    print("packages:", file=file)
    for label, names in _PACKAGES.items():
        print(f"  {label:15s} {_version(names) or 'not installed'}", file=file)
    gpus = detect_gpus()
    print("GPUs:" if gpus else "GPUs: none visible (no nvidia-smi, or it lists no GPU)", file=file)
    for g in gpus:
        cc = ".".join(map(str, g.compute_capability)) if g.compute_capability else "?"
        print(f"  {g.index}: {g.name}, {g.memory_mib:,} MiB, compute {cc}, driver {g.driver}; hardware JPEG decoder: "
              f"{'yes' if g.hardware_jpeg_decoder else 'no'}; optical-flow engine: "
              f"{'yes' if g.optical_flow_engine else 'no'}", file=file)
    backend, why = auto_backend(gpus)
    print(f"--data-backend auto: {backend} ({why})", file=file)
    if _version(("tensorflow-cpu",)) and gpus:
        print("  note: tensorflow-cpu cannot see the GPU: the TensorFlow scripts use dali-cpu here", file=file)
    print(f"sample data: {default_root()} (set $CROSSDALI_DATA to move it; `crossdali make-data` builds it)", file=file)
