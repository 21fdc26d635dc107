"""Eager inference: DALI's dynamic mode (``crossdali.common.eager``) gives the pipeline Predictor's
bits on the same bytes (real JPEGs of the sample set, PNGs of awkward sizes, a converted GIF); the
``auto`` rule picks it for small runs without building a pipeline (and, for one request per process,
only where it starts faster); errors name the file; ``crossdali predict --engine`` selects either
engine. Eager is CPU-only: asked for on CUDA it is refused before any CUDA work (runs without a GPU)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

from PIL import Image  # noqa: E402

from crossdali.common.classification import ClassificationTransform  # noqa: E402
from crossdali.common.data.sources import resolve_source  # noqa: E402
from crossdali.common.eager import EagerPreprocessor, val_geometry  # noqa: E402
from crossdali.common.errors import DataError, UsageError  # noqa: E402
from crossdali.common.inference import (  # noqa: E402
    EAGER_MAX_IMAGES,
    EAGER_STARTS_FASTER,
    InferencePipeline,
    choose_engine,
    prepare_image,
)
from crossdali.common.options import PipelineOptions  # noqa: E402
from crossdali.pytorch.predict import Predictor, run  # noqa: E402

CROP = 32
CLASSES = [f"c{i}" for i in range(11)]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return torchvision.models.get_model("resnet18", weights=None, num_classes=len(CLASSES)).eval()


@pytest.fixture(scope="module")
def encoded(tiny_classification):
    files = resolve_source(tiny_classification / "imagefolder", "val").files
    return [prepare_image(Path(f).read_bytes(), name=str(f)) for f in files]


def _predictor(model, engine: str, device: str = "cpu") -> Predictor:
    return Predictor(model, crop_size=CROP, class_names=CLASSES, device=device, max_batch_size=16, engine=engine)


def _awkward_images() -> list:
    """PNGs and JPEGs of the sizes that test the val geometry: square, portrait, landscape, odd and even
    margins around the crop, a side equal to the resize target, a long strip."""
    rng = np.random.default_rng(0)
    out = []
    for i, (h, w) in enumerate([(37, 37), (36, 91), (91, 36), (64, 65), (65, 64), (48, 37), (37, 300), (501, 73)]):
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, "PNG" if i % 2 else "JPEG")
        out.append(prepare_image(buf.getvalue(), name=f"{h}x{w}"))
    return out


def test_val_geometry_is_torchvisions():
    """Resize of the shorter side (longer side truncated) and the centre-crop anchor (half to even), as
    torchvision's eval transform computes them."""
    from torchvision.transforms.v2 import functional as F

    for h, w in [(37, 37), (36, 91), (91, 36), (64, 65), (65, 64), (500, 333), (333, 500), (37, 300)]:
        out_h, out_w, pos_y, pos_x = val_geometry(h, w, resize=37, crop=CROP)
        resized = F.resize(torch.zeros(1, h, w), [37])
        assert (out_h, out_w) == tuple(resized.shape[1:])
        marked = torch.arange(out_h * out_w, dtype=torch.float32).reshape(1, out_h, out_w)
        top_left = int(F.center_crop(marked, [CROP])[0, 0, 0])
        assert (top_left // out_w, top_left % out_w) == (
            round(float(pos_y) * max(out_h - CROP, 1)), round(float(pos_x) * max(out_w - CROP, 1)))
        assert pos_y.dtype == pos_x.dtype == np.float32


def test_eager_predictor_gives_the_pipeline_predictors_bits(model, encoded, tmp_path):
    """Every sample JPEG, alone and in batches, plus awkward sizes and a GIF converted to PNG."""
    rgb = Image.open(io.BytesIO(encoded[3].data.tobytes())).convert("RGB").quantize(32).convert("RGB")
    rgb.save(tmp_path / "cat.gif")
    gif = prepare_image((tmp_path / "cat.gif").read_bytes(), name="cat.gif")
    images = [*encoded, *_awkward_images(), gif]
    eager, pipeline = _predictor(model, "eager"), _predictor(model, "pipeline")
    for start, size in [(0, 1), (1, 7), (8, 16), (24, 16), (40, 16), (56, 8)]:
        batch = images[start:start + size]
        assert torch.equal(eager.preprocess(batch), pipeline.preprocess(batch)), (start, size)
    assert torch.equal(eager.preprocess(images[-1:]), pipeline.preprocess(images[-1:]))  # the GIF, alone
    assert eager._pipeline is None and pipeline._eager is None  # neither built the other engine
    a, b = eager.predict(images[:5], topk=3), pipeline.predict(images[:5], topk=3)
    assert a == b


def test_other_transforms_layouts_and_types_match_too(encoded):
    """A resize of its own, HWC float16: what the transform says, both engines alike."""
    options = PipelineOptions(batch_size=8, device="cpu", device_id=None, num_threads=2)
    transform = ClassificationTransform(crop_size=29, resize_size=45, output_layout="HWC", dtype="float16")
    pipe, eager = InferencePipeline(options=options, transform=transform), EagerPreprocessor(options=options,
                                                                                             transform=transform)
    out = eager.run(encoded[:8])
    assert out.layout == "HWC"
    assert np.array_equal(np.asarray(pipe.run(encoded[:8]).as_tensor()), out.torch().numpy())
    assert out.torch().dtype == torch.float16 and tuple(out.torch().shape) == (8, 29, 29, 3)


def test_auto_takes_eager_for_small_runs_and_builds_no_pipeline_for_them(model, encoded):
    small = EAGER_MAX_IMAGES["cpu"]
    assert choose_engine("auto", 1, device="cpu") == choose_engine("auto", small, device="cpu") == "eager"
    assert choose_engine("auto", small + 1, device="cpu") == "pipeline"
    assert choose_engine("pipeline", 1, device="gpu") == "pipeline" and choose_engine("eager", 64, device="cpu") == "eager"
    assert choose_engine("auto", 1, device="gpu") == choose_engine("auto", 1, device="gpu", one_shot=True) == "pipeline"
    # one request per process (the command): eager only where it also starts faster than the pipeline builds
    expected = "eager" if EAGER_STARTS_FASTER["cpu"] else "pipeline"
    assert choose_engine("auto", 1, device="cpu", one_shot=True) == expected
    assert choose_engine("auto", small + 1, device="cpu", one_shot=True) == "pipeline"
    assert choose_engine("eager", 1, device="cpu", one_shot=True) == "eager"
    with pytest.raises(ValueError, match="engine must be one of auto, eager, pipeline, got 'fast'"):
        choose_engine("fast", 1, device="cpu")
    with pytest.raises(ValueError, match="engine must be one of"):
        _predictor(model, "fast")
    predictor = _predictor(model, "auto")
    predictor.predict(encoded[:small])
    assert predictor._pipeline is None  # a handful of images: no pipeline built
    predictor.predict(encoded[:small + 1])
    assert predictor._pipeline is not None


def test_eager_errors_name_the_file_and_the_next_run_is_served(model, encoded, tmp_path):
    predictor = _predictor(model, "eager")
    (tmp_path / "cut.jpg").write_bytes(encoded[0].data.tobytes()[:300])
    with pytest.raises(DataError, match=r"cut.jpg cannot be decoded"):
        predictor.predict([encoded[1], tmp_path / "cut.jpg"])
    assert torch.equal(predictor.preprocess(encoded[1:3]), _predictor(predictor.model, "pipeline").preprocess(encoded[1:3]))


def test_predict_command_engines_print_the_same(model, tiny_classification, tmp_path, capsys):
    ckpt = tmp_path / "checkpoint_best.pth"
    torch.save({"model": model.state_dict(), "class_names": CLASSES,
                "config": {"arch": "resnet18", "crop_size": CROP, "num_classes": len(CLASSES)}}, ckpt)
    files = [str(f) for f in sorted((tiny_classification / "imagefolder" / "val").glob("*/*.jpg"))[:3]]
    printed = {}
    for engine in ("eager", "pipeline"):
        assert run([str(ckpt), *files, "--engine", engine, "--json"]) == 0
        printed[engine] = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert printed["eager"] == printed["pipeline"] and len(printed["eager"]) == 3
    with pytest.raises(SystemExit) as exit_info:
        run([str(ckpt), files[0], "--engine", "fast"])
    assert exit_info.value.code == 2 and "invalid choice: 'fast'" in capsys.readouterr().err


def test_eager_on_cuda_is_refused_before_any_cuda_work(model, tiny_classification, tmp_path, capsys):
    """``engine="eager"`` with a CUDA device: a ``UsageError`` naming ``--engine eager`` and the fix, from
    ``choose_engine``, ``Predictor`` and ``EagerPreprocessor``, before CUDA is touched (so also here, where no
    GPU is visible); ``crossdali predict --engine eager --device cuda`` prints it as one line and exits 2."""
    refused = r"^--engine eager .*CPU only.*use --engine pipeline or auto, or --device cpu$"
    initialised = torch.cuda.is_initialized()
    with pytest.raises(UsageError, match=refused):
        choose_engine("eager", 1, device="gpu")
    for device in ("cuda", "cuda:0", torch.device("cuda", 0)):
        with pytest.raises(UsageError, match=refused):
            _predictor(model, "eager", device)
    with pytest.raises(UsageError, match=refused):
        EagerPreprocessor(options=PipelineOptions(batch_size=1, device="gpu", device_id=0, num_threads=1))
    assert torch.cuda.is_initialized() == initialised and next(model.parameters()).device.type == "cpu"
    ckpt = tmp_path / "checkpoint_best.pth"
    torch.save({"model": model.state_dict(), "class_names": CLASSES,
                "config": {"arch": "resnet18", "crop_size": CROP, "num_classes": len(CLASSES)}}, ckpt)
    image = str(next((tiny_classification / "imagefolder" / "val").glob("*/*.jpg")))
    assert run([str(ckpt), image, "--engine", "eager", "--device", "cuda"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.strip().splitlines()) == 1, out.err
    assert out.err.startswith("crossdali predict: --engine eager ") and "--device cpu" in out.err
    assert torch.cuda.is_initialized() == initialised


@pytest.mark.slow
def test_predict_latency_benchmark_smoke(tmp_path, data_root, repo_root):
    """``benchmarks/predict_latency.py --smoke``: every row per image and per batch, the crossover, both cold
    starts, the JSON and the plot."""
    import importlib.util
    import os
    import subprocess
    import sys

    env = {**os.environ, "CROSSDALI_DATA": str(data_root), "OMP_NUM_THREADS": "2"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.predict_latency", "--smoke", "--out", str(tmp_path)],
                          env=env, cwd=repo_root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "predict_latency_cpu.json").read_text())
    assert [r["kind"] for r in report["results"]] == ["eager", "pipeline", "pil"] and report["gpu"] is None
    for row in report["results"]:
        assert "error" not in row, row
        assert 0 < row["per_image"]["median_ms"] <= row["per_image"]["p90_ms"] and row["per_batch"]["img_s"] > 0, row
    assert [p["images"] for p in report["crossover"]] == [1, 8] and report["eager_max_images"] in (0, 1, 8)
    assert set(report["cold_start"]) == {"eager", "pipeline"}
    assert all(v["first_ms"] > 0 and v["second_ms"] > 0 for v in report["cold_start"].values()), report["cold_start"]
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "predict_latency_cpu.png").stat().st_size > 10_000
