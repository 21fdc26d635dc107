"""DALI's val transform against torchvision's, on the same JPEGs.

Tolerance, measured on the tiny sample set (55 images, 96-160 px, so both up- and down-scaling):
max |difference| <= 1 grey level and mean <= 0.25 grey level (in 0-255 units, i.e. after undoing
the normalisation). Why not zero: both decode with libjpeg-turbo (bit-identical) and round sizes
and crop positions the same way (crossdali.common.classification._val_geometry), but DALI's and
torchvision's antialiased bilinear filters differ in the last bit of rounding.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from crossdali.common.classification import IMAGENET_STD  # noqa: E402
from crossdali.pytorch import create_classification_loader  # noqa: E402


@pytest.mark.parametrize("crop", [64, 224])
def test_dali_val_matches_torchvision_val(tiny_classification, crop):
    data = tiny_classification / "imagefolder"
    dali = list(create_classification_loader(data, train=False, backend="dali-cpu", batch_size=16, crop_size=crop))
    native = list(create_classification_loader(data, train=False, backend="native", batch_size=16, crop_size=crop,
                                               workers=0))
    a, b = torch.cat([x for x, _ in dali]), torch.cat([x for x, _ in native])
    assert torch.equal(torch.cat([y for _, y in dali]), torch.cat([y for _, y in native]))
    grey_levels = ((a - b) * torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)).abs()
    assert grey_levels.max() <= 1.0 + 1e-3, f"max difference {grey_levels.max():.2f} grey levels"
    assert grey_levels.mean() <= 0.25, f"mean difference {grey_levels.mean():.3f} grey levels"
