"""The real photographs the sample datasets are cut from: the ones shipped in scikit-image's wheel.

They are located with ``importlib.util.find_spec`` and read with PIL, never through
``import skimage``: the MXNet environment pins numpy 1.23 and must not need to import it.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy as np
from PIL import Image

__all__ = ["CLASS_PHOTOS", "BACKGROUND_PHOTOS", "photo_dir", "load_photo"]

#: One class per photo: the photos differ in content, colour and texture, so a small CNN can
#: learn them from random crops in a couple of epochs. 11 classes: odd-sized val sets by default.
CLASS_PHOTOS: tuple[str, ...] = (
    "astronaut.png",
    "brick.png",
    "camera.png",
    "chelsea.png",
    "coffee.png",
    "coins.png",
    "grass.png",
    "hubble_deep_field.jpg",
    "ihc.png",
    "retina.jpg",
    "rocket.jpg",
)

#: Textures used as backgrounds for the detection and video samples.
BACKGROUND_PHOTOS: tuple[str, ...] = ("grass.png", "gravel.png", "brick.png", "moon.png")


def photo_dir() -> Path:
    """Folder holding scikit-image's sample photos, without importing scikit-image."""
    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "the sample datasets are cut from the photos shipped with scikit-image, which is not "
            "installed: pip install scikit-image (only its data files are read)"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "data"
    if not folder.is_dir():
        raise FileNotFoundError(f"scikit-image is installed but {folder} is missing; reinstall it")
    return folder


@functools.lru_cache(maxsize=32)
def load_photo(name: str) -> np.ndarray:
    """The photo ``name`` as an RGB uint8 array (greyscale and RGBA photos are converted)."""
    path = photo_dir() / name
    if not path.is_file():
        raise FileNotFoundError(f"sample photo {path} is missing from the scikit-image install")
    with Image.open(path) as img:
        arr = np.asarray(img.convert("RGB"))
    arr.setflags(write=False)
    return arr
