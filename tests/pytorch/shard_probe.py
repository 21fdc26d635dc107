"""Run under a launcher by test_launch.py: records which val samples this rank's loader yields."""

import json
import sys
from pathlib import Path

from crossdali.common.distributed import detect_distributed
from crossdali.pytorch import create_classification_loader

if __name__ == "__main__":
    data, out, backend = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    dist = detect_distributed()
    loader = create_classification_loader(data, train=False, backend=backend, batch_size=8, crop_size=16,
                                          workers=1, dist=dist, data_format="filelist")
    seen = [i for _, labels in loader for i in labels.tolist()]
    (out / f"rank{dist.rank}.json").write_text(json.dumps({"dist": list(dist.__dict__.values()), "seen": seen}))
