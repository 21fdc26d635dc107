"""``--auto-augment``: DALI's augmentation policies in the shared train pipeline, on real JPEG bytes.

Each policy runs on the CPU (CI) and, where a GPU is visible, on the GPU; the pipeline's seed fixes
every random choice (same seed, same pixels; another seed, other pixels); ``none`` is the pipeline
without a policy, graph and pixels; a wrong name or a backend without a DALI pipeline is one line
and exit 2. Cross-framework equality of a policy's pixels is the parity dump's ``train_auto_augment``
split (crossdali/parity.py).
"""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from crossdali.common.augment import AUTO_AUGMENT_POLICIES, check_auto_augment
from crossdali.common.classification import ClassificationTransform, PipelineOptions, create_classification_pipeline
from crossdali.common.data.sources import resolve_source
from crossdali.common.errors import UsageError
from crossdali.common.scripts import script_parsers
from crossdali.common.scripts.train_args import resolve_auto_augment

CROP, BATCH = 32, 8
POLICIES = [p for p in AUTO_AUGMENT_POLICIES if p != "none"]


@pytest.fixture(scope="module")
def train_source(tiny_classification):
    return resolve_source(tiny_classification / "imagefolder", "train")


def _batches(source, *, policy: str | None, seed: int = 3, device: str = "cpu", count: int = 2,
             source_format: str | None = None) -> list[np.ndarray]:
    transform = (ClassificationTransform(crop_size=CROP) if policy is None
                 else ClassificationTransform(crop_size=CROP, auto_augment=policy))
    options = PipelineOptions(batch_size=BATCH, num_threads=1, seed=seed, device=device,
                              device_id=0 if device == "gpu" else None)
    pipe = create_classification_pipeline(source, train=True, options=options, transform=transform)
    pipe.build()
    out = []
    for _ in range(count):
        images, _labels = pipe.run()
        images = images.as_cpu() if device == "gpu" else images
        out.append(np.array(images.as_tensor()))
    return out


@pytest.fixture(scope="module")
def plain(train_source) -> list[np.ndarray]:
    """The train batches with no policy, seed 3."""
    return _batches(train_source, policy=None)


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("policy", POLICIES)
def test_policy_runs_on_real_jpegs_and_changes_pixels(train_source, plain, policy, device):
    got = _batches(train_source, policy=policy, device=device)
    for batch in got:
        assert batch.shape == (BATCH, 3, CROP, CROP) and batch.dtype == np.float32
        assert np.isfinite(batch).all()
    if device == "cpu":
        # same seed, same crops; the policy changes some samples' pixels (none of the policies is identity
        # on every sample of two batches)
        assert any(not np.array_equal(a, b) for a, b in zip(got, plain)), f"{policy} changed no pixel"


def test_seed_fixes_the_policy_and_another_seed_differs(train_source):
    first = _batches(train_source, policy="randaugment", seed=11)
    again = _batches(train_source, policy="randaugment", seed=11)
    other = _batches(train_source, policy="randaugment", seed=12)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)  # bit for bit
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))


def test_none_is_the_pipeline_without_a_policy(train_source, plain):
    options = PipelineOptions(batch_size=BATCH, num_threads=1, seed=3)
    graphs = [create_classification_pipeline(train_source, train=True, options=options, transform=t).serialize()
              for t in (ClassificationTransform(crop_size=CROP), ClassificationTransform(crop_size=CROP, auto_augment="none"))]
    assert graphs[0] == graphs[1]
    for a, b in zip(plain, _batches(train_source, policy="none")):
        np.testing.assert_array_equal(a, b)


def test_val_pipeline_ignores_the_policy(tiny_classification):
    """The policy is a train augmentation: val batches stay the plain centre crop."""
    source = resolve_source(tiny_classification / "imagefolder", "val")
    options = PipelineOptions(batch_size=BATCH, num_threads=1)
    graphs = [create_classification_pipeline(source, train=False, options=options,
                                             transform=ClassificationTransform(crop_size=CROP, auto_augment=p)).serialize()
              for p in ("none", "trivialaugment")]
    assert graphs[0] == graphs[1]


@pytest.mark.parametrize("make_parser", [script_parsers.pytorch_classification, script_parsers.tensorflow_classification,
                                         script_parsers.jax_classification, script_parsers.mxnet_classification])
def test_every_classification_script_has_the_flag_and_refuses_a_bad_name(make_parser, capsys):
    parser = make_parser()
    assert parser.parse_args([]).auto_augment == "none"
    assert parser.parse_args(["--auto-augment", "trivialaugment"]).auto_augment == "trivialaugment"
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--auto-augment", "augmix"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--auto-augment" in err and "trivialaugment" in err


def test_refused_where_nothing_would_run_it():
    for backend in ("native", "synthetic"):
        with pytest.raises(UsageError, match=f"--data-backend {backend}.*dali-gpu or dali-cpu"):
            check_auto_augment("randaugment", backend=backend)
        assert check_auto_augment("none", backend=backend) == "none"
    with pytest.raises(UsageError, match="--multi-label"):
        resolve_auto_augment(argparse.Namespace(auto_augment="autoaugment", multi_label=True), backend="dali-cpu")
    assert resolve_auto_augment(argparse.Namespace(auto_augment="autoaugment", multi_label=False),
                                backend="dali-cpu") == "autoaugment"
    with pytest.raises(ValueError, match="auto_augment must be one of"):
        ClassificationTransform(auto_augment="AutoAugment")
