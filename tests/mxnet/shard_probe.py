"""Run as a dist_sync worker by test_mxnet_train.py: records which val samples this rank's iterator yields."""

import json
import sys
from pathlib import Path

from crossdali.mxnet import create_classification_loader
from crossdali.mxnet.distributed import init_distributed

if __name__ == "__main__":
    data, out = Path(sys.argv[1]), Path(sys.argv[2])
    runtime = init_distributed()
    it = create_classification_loader(data, train=False, batch_size=8, crop_size=16, workers=1, dist=runtime.dist,
                                      data_format="filelist")
    seen = [int(v) for b in it for v in b.label[0].asnumpy()[: 8 - b.pad]]
    total = runtime.all_reduce_sum([len(seen)])[0]
    (out / f"rank{runtime.dist.rank}.json").write_text(json.dumps(
        {"dist": [runtime.dist.rank, runtime.dist.world_size, runtime.engine], "seen": seen, "total": total}))
