"""Data-parallel set-up for MXNet: Horovod when the job was started by horovodrun/mpirun and
``horovod.mxnet`` imports, else MXNet's own parameter-server kvstore (``dist_sync``).

- Horovod: rank and world size come from ``crossdali.common.distributed`` (the launcher's
  variables) and are checked against ``hvd.rank()``; gradients are all-reduced by
  ``hvd.DistributedTrainer``.
- kvstore: MXNet's launchers (``crossdali.mxnet.launch`` here, ``tools/launch.py`` of the MXNet
  repository for ssh/mpi/yarn) set only ``DMLC_*`` variables; a worker's rank is assigned when
  it registers with the scheduler, so it is read from ``kv.rank``. Gradients are summed by the
  servers (``KVStoreTrainer``: the servers hold no optimizer, so the same kvstore can also sum
  metrics) and every worker applies the same update.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import mxnet as mx
import numpy as np

from crossdali.common.distributed import ENGINES as FRAMEWORK_ENGINES
from crossdali.common.distributed import DistInfo, detect_distributed, gather_rows_by_sum

__all__ = ["Runtime", "KVStoreTrainer", "init_distributed", "ENGINES"]

log = logging.getLogger(__name__)

ENGINES = FRAMEWORK_ENGINES["mxnet"]
# Integer keys are the trainer's parameter indices (0..n-1); metrics use one far above them.
_METRICS_KEY = 1_000_003
_BN_KEYS = 2_000_003
_GATHER_KEYS = 3_000_003


@dataclass
class Runtime:
    """This process's place in the job, its device and the engine that averages gradients."""

    dist: DistInfo
    context: mx.Context
    engine: str  # "none" | "horovod" | "kvstore"
    kvstore: object | None = None
    _metric_keys: set = field(default_factory=set)

    @property
    def gpu_id(self) -> int | None:
        """The GPU of this rank (its DALI pipelines' ``device_id``); ``None`` on the CPU."""
        return self.context.device_id if self.context.device_type == "gpu" else None

    def make_trainer(self, params, optimizer: str, optimizer_params: dict) -> mx.gluon.Trainer:
        if self.engine == "horovod":
            import horovod.mxnet as hvd

            hvd.broadcast_parameters(params, root_rank=0)
            return hvd.DistributedTrainer(params, optimizer, optimizer_params)
        if self.engine == "kvstore":
            return KVStoreTrainer(params, optimizer, optimizer_params, kvstore=self.kvstore)
        return mx.gluon.Trainer(params, optimizer, optimizer_params, kvstore=None)

    def _reduce(self, arr: mx.nd.NDArray, key: int) -> mx.nd.NDArray:
        """Sum a flat float64 NDArray over all workers; ``key``: the kvstore key of arrays of its size."""
        if self.engine == "horovod":
            import horovod.mxnet as hvd

            return hvd.allreduce(arr, average=False, name=f"reduce{key}")
        if self.engine == "kvstore":
            if key not in self._metric_keys:  # a kvstore key keeps the size it was created with
                self.kvstore.init(key, mx.nd.zeros(arr.shape, dtype=np.float64))
                self._metric_keys.add(key)
            self.kvstore.push(key, arr)
            out = mx.nd.zeros(arr.shape, dtype=np.float64)
            self.kvstore.pull(key, out=out)
            return out
        return arr

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        """Sum ``values`` over all workers (metric counts and sums)."""
        arr = mx.nd.array(np.asarray(values, dtype=np.float64), dtype=np.float64)
        return self._reduce(arr, _METRICS_KEY + len(values)).asnumpy().tolist()

    def gather_rows(self, rows: np.ndarray) -> np.ndarray:
        """Every worker's ``rows`` stacked in rank order, on every worker (``gather_rows_by_sum``)."""
        def sum_array(block: np.ndarray) -> np.ndarray:
            flat = mx.nd.array(block.reshape(-1), dtype=np.float64)
            return self._reduce(flat, _GATHER_KEYS + flat.size).asnumpy()

        return gather_rows_by_sum(rows, rank=self.dist.rank, world=self.dist.world_size,
                                  sum_values=self.all_reduce_sum, sum_array=sum_array)

    def sync_batchnorm_stats(self, net: mx.gluon.Block) -> None:
        """Make BatchNorm's running statistics (the parameters without gradients) the same on every
        worker before evaluating: gradients are averaged, these are not, so each rank would
        evaluate (and rank 0 save) its own. Horovod: rank 0's; kvstore: the mean over workers."""
        stats = {name: p.data() for name, p in net.collect_params().items() if p.grad_req == "null"}
        if self.engine == "horovod":
            import horovod.mxnet as hvd

            hvd.broadcast_parameters(stats, root_rank=0)
        elif self.engine == "kvstore":
            for i, name in enumerate(sorted(stats)):
                key, value = _BN_KEYS + i, stats[name]
                if key not in self._metric_keys:
                    self.kvstore.init(key, mx.nd.zeros(value.shape, dtype=value.dtype))
                    self._metric_keys.add(key)
                self.kvstore.push(key, value)
                self.kvstore.pull(key, out=value)
                value /= self.dist.world_size

    def barrier(self) -> None:
        if self.engine == "kvstore":
            self.kvstore._barrier()  # the public API has none; Module.fit uses the same call
        elif self.engine == "horovod":
            self.all_reduce_sum([0.0])


class KVStoreTrainer(mx.gluon.Trainer):
    """A Gluon ``Trainer`` whose gradients are summed over the workers of a ``dist_sync`` kvstore,
    the way Horovod's ``DistributedTrainer`` does it over allreduce.

    Why not ``Trainer(kvstore=kv)``: Gluon sets the kvstore up lazily in the first ``step()`` and
    broadcasts rank 0's weights through the keys the gradients then use; on a CPU kvstore nothing
    orders that broadcast's pull before the first gradient push, so a worker can pull the
    gradient sum as its weights (CI caught it; 2 of 4 two-worker runs diverged on a loaded 2-core
    machine). Here every key is initialised and the weights are broadcast before training, and
    each worker waits for that before its first push. Parameters need their shapes: run one
    forward pass first (Gluon's deferred initialisation).
    """

    def __init__(self, params, optimizer, optimizer_params, *, kvstore) -> None:
        super().__init__(params, optimizer, optimizer_params, kvstore=None)
        deferred = [p.name for p in self._params if p._deferred_init]
        if deferred:
            raise RuntimeError(f"parameters {deferred[:3]} have no shape yet: run one forward pass "
                               "before creating the trainer, so the kvstore can broadcast them")
        self._kv = kvstore
        keys = list(range(len(self._params)))
        # plain copies: after a forward pass on the CPU the weights may be in MKL-DNN's blocked
        # layout, which the kvstore cannot send
        weights = [mx.nd.array(p.data().asnumpy(), ctx=p.data().context, dtype=p.dtype) for p in self._params]
        kvstore.init(keys, weights)  # rank 0's values; the others' are ignored
        mx.nd.waitall()
        kvstore._barrier()  # every worker: rank 0's init reached the server before anyone pulls
        kvstore.pull(keys, out=weights)  # every rank starts from rank 0's weights (BatchNorm statistics too)
        mx.nd.waitall()
        for param, weight in zip(self._params, weights):
            param.set_data(weight)
        kvstore._barrier()  # and nobody pushes a gradient into those keys before everyone has pulled

    def _allreduce_grads(self) -> None:
        for i, param in enumerate(self._params):
            if param.grad_req != "null":
                # pull overwrites the gradient with the sum over workers, as Gluon's kvstore path does
                self._kv.push(i, param.list_grad(), priority=-i)
                self._kv.pull(i, param.list_grad(), priority=-i)


def _horovod_available() -> bool:
    try:
        import horovod.mxnet  # noqa: F401
    except ImportError:
        return False
    return True


def init_distributed(*, engine: str = "auto") -> Runtime:
    """Join the job the launcher started (see the module docstring). ``engine="auto"``:
    Horovod under horovodrun or mpirun (when importable), kvstore under a DMLC launcher, a
    single process otherwise."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    dist = detect_distributed()
    dmlc_worker = os.environ.get("DMLC_ROLE") == "worker"
    if engine == "auto":
        if dist.launcher == "horovodrun" or (dist.launcher in ("openmpi", "mpich") and _horovod_available()):
            engine = "horovod"
        elif dmlc_worker:
            engine = "kvstore"
        elif dist.is_distributed:
            raise RuntimeError(f"{dist.world_size} processes started by {dist.launcher}, but horovod.mxnet cannot be "
                               "imported and no DMLC_ROLE is set: install Horovod with MXNet support, or launch with "
                               "`python -m crossdali.mxnet.launch -n N -- python -m crossdali.mxnet.train_classification`")
        else:
            engine = "none"
    kvstore = None
    if engine == "horovod":
        try:
            import horovod.mxnet as hvd
        except ImportError:
            raise ImportError("this job was started by horovodrun but horovod.mxnet cannot be imported: build "
                              "Horovod with HOROVOD_WITH_MXNET=1, or use the kvstore launcher "
                              "(python -m crossdali.mxnet.launch)") from None
        hvd.init()
        if dist.is_distributed and (hvd.rank(), hvd.size()) != (dist.rank, dist.world_size):
            raise RuntimeError(f"Horovod says rank {hvd.rank()}/{hvd.size()} but {dist.launcher} set "
                               f"{dist.rank}/{dist.world_size}; check the launch command")
        dist = DistInfo(rank=hvd.rank(), world_size=hvd.size(), local_rank=hvd.local_rank(), launcher=dist.launcher)
    elif engine == "kvstore":
        if not dmlc_worker:
            raise RuntimeError("--engine kvstore needs a DMLC launcher (DMLC_ROLE=worker is not set): "
                               "python -m crossdali.mxnet.launch -n N -- python -m crossdali.mxnet.train_classification")
        kvstore = mx.kv.create("dist_sync")
        num_gpus = mx.context.num_gpus()
        local = kvstore.rank % num_gpus if num_gpus else 0
        dist = DistInfo(rank=kvstore.rank, world_size=kvstore.num_workers, local_rank=local, launcher="dmlc")
    num_gpus = mx.context.num_gpus()  # the local rank's GPU, or the one GPU a launcher bound this process to
    context = mx.gpu(dist.gpu_id(visible_gpus=num_gpus)) if num_gpus > 0 else mx.cpu()
    return Runtime(dist=dist, context=context, engine=engine, kvstore=kvstore)
