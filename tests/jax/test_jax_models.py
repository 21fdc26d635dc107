"""The JAX column of the model table is exactly the flax models of crossdali.jax.models."""

from __future__ import annotations

import pytest

pytest.importorskip("flax")

from crossdali.common.models import builder_name, models_for  # noqa: E402
from crossdali.jax.models import ARCHS, create_model  # noqa: E402


def test_the_table_lists_the_flax_models():
    assert sorted(builder_name(n, "jax") for n in models_for("jax")) == sorted(ARCHS)


def test_a_name_jax_lacks_says_which_frameworks_have_it():
    with pytest.raises(ValueError, match="'mobilenet_v2' is not available in jax, only in pytorch, tensorflow, mxnet"):
        create_model("mobilenetv2", num_classes=3)
