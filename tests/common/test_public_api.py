"""The import paths users write keep working: each framework package's factories, the pipeline
definitions of ``crossdali.common``, the errors and the ``python -m`` entry points.

A framework is imported inside its test and skipped where that framework is not installed, so this
file runs in every test environment (each framework has its own).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect

import pytest

#: framework package -> the framework it imports -> names every user of that package may write
FRAMEWORK_NAMES = {
    "crossdali.pytorch": ("torch", {
        "BACKENDS", "VIDEO_BACKENDS", "DETECTION_BACKENDS", "create_classification_loader", "create_video_loader",
        "create_detection_loader", "create_external_source_loader",
    }),
    "crossdali.tensorflow": ("tensorflow", {
        "BACKENDS", "VIDEO_BACKENDS", "DETECTION_BACKENDS", "create_classification_loader", "create_video_loader",
        "create_detection_loader", "create_classification_dataset", "create_video_dataset", "create_detection_dataset",
        "DALILoader", "NativeLoader", "SyntheticLoader", "enable_memory_growth",
    }),
    "crossdali.jax": ("jax", {
        "BACKENDS", "VIDEO_BACKENDS", "DETECTION_BACKENDS", "create_classification_loader", "create_video_loader",
        "create_detection_loader", "create_external_source_loader",
    }),
    "crossdali.mxnet": ("mxnet", {
        "BACKENDS", "DALIClassificationIter", "ExternalSourceOptions", "create_classification_loader",
        "create_external_source_loader", "create_multilabel_loader",
    }),
}

#: framework-free modules -> names users import from them
COMMON_NAMES = {
    "crossdali.common.classification": {
        "READER_NAME", "IMAGENET_MEAN", "IMAGENET_STD", "PipelineOptions", "ClassificationTransform",
        "augment_classification", "create_classification_pipeline",
    },
    "crossdali.common.detection": {
        "DetectionSource", "DetectionTransform", "coco_problems", "resolve_detection_source", "create_detection_pipeline",
        "explain_detection_failure",
    },
    "crossdali.common.video": {
        "ClipTransform", "KINETICS_MEAN", "KINETICS_STD", "VIDEO_READER_NAME", "create_clip_pipeline",
        "default_video_pipelines", "explain_video_failure", "resolve_video_source",
    },
    "crossdali.common.optical_flow": {
        "OpticalFlowUnavailable", "create_optical_flow_pipeline", "flow_to_frame_pixels", "require_optical_flow_hardware",
    },
    "crossdali.common.external": {
        "ExternalSourceOptions", "create_external_source_pipeline", "create_packed_external_source_pipeline",
        "prepare_external_source",
    },
    "crossdali.common.multilabel": {"MultiLabelSource", "resolve_multilabel_source", "multilabel_metrics"},
    "crossdali.common.inference": {"InferencePipeline", "MicroBatcher", "prepare_image"},
    "crossdali.common.options": {"PipelineOptions", "DALI_BACKENDS", "CLASSIFICATION_BACKENDS"},
    "crossdali.common.distributed": {"DistInfo", "detect_distributed"},
    "crossdali.common.anchors": {"DefaultBoxes", "ssd300_default_boxes"},
    "crossdali.common.errors": {"DataError", "UsageError"},
    "crossdali.common.data.sources": {"DataSource", "resolve_source"},
    "crossdali.common.data.videos": {"check_videos", "probe_video", "count_clips", "reencode_command"},
    "crossdali.common.data.coco": {"DetectionSource", "resolve_detection_source", "coco_problems"},
    "crossdali.common.data.check": {"check_data", "check_before_training", "load_exclusions", "Exclusions"},
    "crossdali.common.data.sample_data": {"ensure_classification", "ensure_detection", "ensure_multilabel",
                                          "default_root", "BUILDERS"},
    "crossdali.common.loading.loaders": {"Loader", "prepare_split"},
    "crossdali.common.scripts.script": {"run", "TrainingStopped", "USER_ERRORS"},
}

#: ``python -m`` entry points the docs name
ENTRY_POINTS = ["crossdali", "crossdali.common.data.check", "crossdali.common.data.sample_data"]


def _missing(module, names: set[str]) -> list[str]:
    return sorted(n for n in names if not hasattr(module, n))


@pytest.mark.parametrize("package", sorted(FRAMEWORK_NAMES))
def test_framework_package_names(package):
    framework, names = FRAMEWORK_NAMES[package]
    pytest.importorskip(framework)
    module = importlib.import_module(package)
    assert _missing(module, names) == []
    assert names <= set(module.__all__), f"{package}.__all__ lost {sorted(names - set(module.__all__))}"
    for name in names:
        if name.startswith("create_"):
            factory = getattr(module, name)
            assert callable(factory)
            if name.endswith("_loader") and not name.endswith("external_source_loader"):
                assert "train" in inspect.signature(factory).parameters, name


@pytest.mark.parametrize("module_name", sorted(COMMON_NAMES))
def test_common_names(module_name):
    module = importlib.import_module(module_name)
    assert _missing(module, COMMON_NAMES[module_name]) == []


def test_pytorch_training_names():
    """The training scripts and benchmarks import these from ``crossdali.pytorch.training``."""
    pytest.importorskip("torch")
    training = importlib.import_module("crossdali.pytorch.training")
    names = {"training_session", "choose_backend", "seed_everything", "build_on_rank0", "create_optimizer",
             "create_scheduler", "MixedPrecision", "resolve_cuda_graphs", "graph_model", "evaluate_classifier",
             "evaluate_multilabel", "accuracy_counts", "gather_objects", "Checkpointer", "TrainState", "load_checkpoint",
             "StepTracker", "StopRequest", "copy_to_host", "Run", "start_run", "SyntheticBatches"}
    assert _missing(training, names) == []


def test_errors_are_one_class_each():
    from crossdali.common.data.sources import resolve_source
    from crossdali.common.errors import DataError, UsageError
    from crossdali.common.scripts.script import USER_ERRORS

    assert issubclass(DataError, ValueError) and issubclass(UsageError, ValueError)
    assert {DataError, UsageError} <= set(USER_ERRORS)
    with pytest.raises(DataError, match="does not exist"):
        resolve_source("/nonexistent/crossdali-data", "train")


@pytest.mark.parametrize("module_name", ENTRY_POINTS)
def test_entry_points_exist(module_name):
    assert importlib.util.find_spec(f"{module_name}.__main__") is not None


def test_common_imports_no_framework():
    """``crossdali.common`` must stay framework-free: importing every public module of it loads no framework."""
    import subprocess
    import sys

    code = ("import sys, importlib\n"
            f"for m in {sorted(COMMON_NAMES)!r}: importlib.import_module(m)\n"
            "print(sorted(f for f in ('torch', 'tensorflow', 'jax', 'mxnet') if f in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
