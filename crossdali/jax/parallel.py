"""Data parallelism for the JAX example: one mesh axis over every device of the job, the batch split
along it and the weights replicated, and ``jax.distributed`` started from the launcher's variables.

    initialize_distributed(detect_distributed())   # several processes: before JAX touches a device
    sharding = batch_sharding()                     # every device of every process, grouped by process
    loader = create_classification_loader(data, train=True, sharding=sharding, batch_size=per_device)
    state = replicate(state, replicated(sharding))

A step jitted over arrays placed this way is data-parallel without any collective written out; the
script's train step (``crossdali.jax.train_classification.make_steps``) runs on each device's rows
instead, so that batch norm uses each device's statistics (as DDP does), and averages the gradients.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from crossdali.common.distributed import DistInfo
from crossdali.common.errors import UsageError
from crossdali.common.scripts.defaults import local_process_count

__all__ = ["AXIS", "batch_sharding", "coordinator_address", "initialize_distributed", "replicate", "replicated"]

log = logging.getLogger(__name__)

#: the mesh axis the batch is split along
AXIS = "data"


def batch_sharding(devices: list | None = None) -> NamedSharding:
    """The batch split over ``devices`` (default: every device of every process), ordered by process
    so that process ``p`` holds mesh positions ``p x devices per process`` onward: the order
    ``crossdali.jax.loaders.ShardedDALILoader`` shards the data in."""
    devices = list(jax.devices() if devices is None else devices)
    devices.sort(key=lambda d: (d.process_index, d.id))
    return NamedSharding(Mesh(np.array(devices), (AXIS,)), PartitionSpec(AXIS))


def replicated(sharding: NamedSharding) -> NamedSharding:
    """A whole copy on every device of ``sharding``'s mesh (the weights and the optimizer state)."""
    return NamedSharding(sharding.mesh, PartitionSpec())


def replicate(tree, sharding: NamedSharding):
    """``tree``'s arrays (the same values in every process) as arrays placed by ``sharding``; works
    across processes, where ``jax.device_put`` onto another process's devices cannot."""
    def place(x):
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
    return jax.tree_util.tree_map(place, jax.device_get(tree))


def coordinator_address(dist: DistInfo, env: Mapping[str, str] | None = None) -> str | None:
    """Where process 0 serves ``jax.distributed``'s coordinator: ``JAX_COORDINATOR_ADDRESS`` if set; under
    torchrun ``MASTER_ADDR`` and the port after ``MASTER_PORT`` (torchrun's own store holds that one);
    else None, for JAX to find it (Slurm, Open MPI) or fail."""
    env = os.environ if env is None else env
    if env.get("JAX_COORDINATOR_ADDRESS"):
        return env["JAX_COORDINATOR_ADDRESS"]
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT", "").isdigit():
        return f"{env['MASTER_ADDR']}:{int(env['MASTER_PORT']) + 1}"
    return None


def initialize_distributed(dist: DistInfo, env: Mapping[str, str] | None = None) -> None:
    """``jax.distributed.initialize`` for the processes a launcher started (``dist`` from
    ``crossdali.common.distributed.detect_distributed``; nothing for one process). Each process then
    drives the GPU of its local rank where the launcher starts several per node (as JAX itself
    chooses under Slurm), unless ``JAX_LOCAL_DEVICE_IDS`` says otherwise; with one process per node
    it drives every GPU there. Must run before anything asks JAX for a device."""
    if not dist.is_distributed:
        return
    env = os.environ if env is None else env
    address = coordinator_address(dist, env)
    if address is None and not any(k in env for k in ("SLURM_JOB_ID", "OMPI_MCA_orte_hnp_uri", "OMPI_MCA_ess_base_jobid",
                                                      "PMIX_SERVER_URI2")):
        raise UsageError(f"{dist.launcher} started {dist.world_size} processes, and jax.distributed needs the address "
                         "of its coordinator: export JAX_COORDINATOR_ADDRESS=HOST:PORT (rank 0's host and a free port) "
                         "in every process")
    local_ids = None
    if not env.get("JAX_LOCAL_DEVICE_IDS") and local_process_count(dist.world_size, env) > 1:
        local_ids = [dist.gpu_id()]  # before JAX starts: CUDA_VISIBLE_DEVICES says whether the launcher bound a GPU
    log.info("jax.distributed: process %d of %d, coordinator %s", dist.rank, dist.world_size,
             address or "found by JAX")
    jax.distributed.initialize(coordinator_address=address, num_processes=dist.world_size, process_id=dist.rank,
                               local_device_ids=local_ids)
