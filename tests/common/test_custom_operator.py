"""crossdali's DALI plugin (plugins/, crossdali.common.plugins): compiled from source by the project's own
build, loaded through DALI's plugin manager, and equal to the three DALI operators it fuses (fn.hsv,
fn.brightness_contrast, fn.crop_mirror_normalize) on real JPEGs, alone and inside the SSD train pipeline
behind the PyTorch loader. TensorFlow, JAX and MXNet run it in their own environments
(tests/<framework>/test_custom_operator_<framework>.py). The first test of a CI run compiles the library
(seconds; cached under $CROSSDALI_CACHE/plugins for every later session)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from crossdali.common.classification import IMAGENET_MEAN, IMAGENET_STD
from crossdali.common.detection import DetectionTransform, create_detection_pipeline, resolve_detection_source
from crossdali.common.options import PipelineOptions

# wider than SSD's ranges: saturated channels, hue past 180 degrees, black and over-bright images
WIDE = dict(hue=(-200.0, 200.0), saturation=(0.0, 3.0), brightness=(0.0, 2.5), contrast=(0.0, 3.0))


@pytest.fixture(scope="module")
def plugin() -> Path:
    from crossdali.common.plugins import build_plugin, load_plugin

    return load_plugin(build_plugin())


@pytest.fixture(scope="module")
def detection_jpegs(data_root) -> list[str]:
    from crossdali.common.data.sample_data.detection import ensure_detection

    root = ensure_detection(data_root, "tiny")
    return sorted(str(p) for p in (root / "train").glob("*.jpg"))[:24]


def _both_spellings(files, *, device: str, batch_size: int = 8, seed: int = 7):
    """One pipeline: real JPEGs decoded and resized to varied, odd sizes, one set of random draws, then
    both spellings of the colour jitter and normalisation."""
    from nvidia.dali import fn, pipeline_def, types

    from crossdali.common.plugins import color_jitter_normalize

    gpu = device == "gpu"

    @pipeline_def(batch_size=batch_size, num_threads=2, device_id=0 if gpu else None, seed=seed)
    def pipe():
        jpegs, _ = fn.readers.file(files=files, name="Reader")
        images = fn.decoders.image(jpegs, device="mixed" if gpu else "cpu", output_type=types.RGB)
        images = fn.resize(images, resize_x=fn.random.uniform(range=[17, 331]),
                           resize_y=fn.random.uniform(range=[9, 240]), min_filter=types.INTERP_TRIANGULAR)
        hue, saturation, brightness, contrast = (fn.random.uniform(range=list(WIDE[k])) for k in WIDE)
        mirror = fn.random.coin_flip()
        ref = fn.hsv(images, hue=hue, saturation=saturation)
        ref = fn.brightness_contrast(ref, brightness=brightness, contrast=contrast)
        ref = fn.crop_mirror_normalize(ref, dtype=types.FLOAT, output_layout="CHW", mean=list(IMAGENET_MEAN),
                                       std=list(IMAGENET_STD), mirror=mirror)
        fused = color_jitter_normalize(images, hue=hue, saturation=saturation, brightness=brightness,
                                       contrast=contrast, mirror=mirror, mean=IMAGENET_MEAN, std=IMAGENET_STD)
        return ref, fused

    return pipe()


def _arrays(out) -> list[np.ndarray]:
    out = out.as_cpu() if hasattr(out, "as_cpu") else out
    return [np.array(out[i]) for i in range(len(out))]


def test_operator_is_bit_identical_to_the_three_dali_operators(plugin, detection_jpegs):
    pipe = _both_spellings(detection_jpegs, device="cpu")
    shapes = set()
    for _ in range(3):
        ref, fused = pipe.run()
        assert fused.layout() == "CHW"
        for want, got in zip(_arrays(ref), _arrays(fused)):
            assert got.dtype == np.float32 and got.shape == want.shape
            np.testing.assert_array_equal(got, want)
            shapes.add(got.shape)
    assert len(shapes) > 10  # varied sizes, not one


def test_fused_ssd_train_batches_equal_the_default_pipeline(plugin, data_root):
    """DetectionTransform(fused_colour=True): the same seed draws the same augmentation, and the PyTorch
    loader gives bit for bit the default pipeline's SSD train batches (images, encoded boxes, labels)."""
    torch = pytest.importorskip("torch")
    from crossdali.common.data.sample_data.detection import ensure_detection
    from crossdali.pytorch import create_detection_loader

    root = ensure_detection(data_root, "tiny")
    source, options = resolve_detection_source(root, "train"), PipelineOptions(batch_size=8, num_threads=1)
    for fused in (False, True):  # the option does swap the operators
        graph = create_detection_pipeline(source, train=True, options=options,
                                          transform=DetectionTransform(fused_colour=fused)).serialize()
        assert (b"crossdali__ColorJitterNormalize" in graph, b"BrightnessContrast" in graph) == (fused, not fused)
    batches = {}
    for fused in (False, True):
        loader = create_detection_loader(root, train=True, batch_size=8, workers=2, seed=5,
                                         transform=DetectionTransform(fused_colour=fused))
        batches[fused] = [tuple(t.clone() for t in b) for b, _ in zip(loader, range(2))]
    for default, fused in zip(batches[False], batches[True]):
        for name, want, got in zip(("images", "boxes", "labels"), default, fused):
            assert torch.equal(got, want), name


def test_not_built_is_one_line_naming_the_library_and_the_build_command(tmp_path):
    env = {**os.environ, "CROSSDALI_CACHE": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "crossdali.common.plugins", "path"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(tmp_path) in lines[0] and "libcrossdali_plugins.so" in lines[0], lines
    assert "python -m crossdali.common.plugins build" in lines[0]


@pytest.mark.gpu
def test_gpu_operator_matches_the_dali_gpu_operators(plugin, detection_jpegs):
    """GPU: every uint8 step (hsv, brightness/contrast) equal, and the normalised floats within 1e-5, a
    fraction of one grey level (1/58 after the division by std): DALI's GPU normalisation may compute
    ``in * (1/std) - mean/std`` as one fused multiply-add where the plugin computes ``(in - mean) * (1/std)``,
    which can differ in the last bit."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    info = json.loads((plugin.parent / "build.json").read_text())
    assert info["gpu"], f"{plugin} was built without the GPU operator (no nvcc where it was built)"
    pipe = _both_spellings(detection_jpegs, device="gpu")
    mean, std = np.array(IMAGENET_MEAN, np.float32)[:, None, None], np.array(IMAGENET_STD, np.float32)[:, None, None]
    for _ in range(3):
        ref, fused = pipe.run()
        for want, got in zip(_arrays(ref), _arrays(fused)):
            np.testing.assert_array_equal(np.rint(got * std + mean), np.rint(want * std + mean))
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


@pytest.mark.gpu
def test_gpu_fused_ssd_train_batches_match_the_default_pipeline(plugin, data_root):
    """dali-gpu: the same draws (boxes and labels equal), images within the tolerance stated above."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from crossdali.common.data.sample_data.detection import ensure_detection
    from crossdali.pytorch import create_detection_loader

    root = ensure_detection(data_root, "tiny")
    batches = {}
    for fused in (False, True):
        loader = create_detection_loader(root, train=True, backend="dali-gpu", batch_size=8, workers=2, seed=5,
                                         transform=DetectionTransform(fused_colour=fused))
        batches[fused] = [tuple(t.clone() for t in b) for b, _ in zip(loader, range(2))]
    for (images, boxes, labels), (f_images, f_boxes, f_labels) in zip(batches[False], batches[True]):
        assert f_images.is_cuda and torch.equal(f_boxes, boxes) and torch.equal(f_labels, labels)
        assert (f_images - images).abs().max().item() <= 1e-5
