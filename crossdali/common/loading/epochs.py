"""What an epoch means, the same for every framework wrapper.

- val: every sample exactly once across all shards (``PARTIAL``: the reader pads each shard's
  last batch and the iterator drops the padding; a shard may end with an empty batch, which the
  wrappers skip).
- train, one process: every sample exactly once (``PARTIAL``).
- train, several processes: ``DROP``. Every rank must take the same number of optimizer steps
  (data-parallel all-reduce), so up to ``world_size * batch_size - 1`` samples are left out of
  each epoch; the reader reshuffles globally every epoch, so a different few each time. The
  count is logged at start-up rather than hidden. Pass ``policy="partial"`` to keep them
  (ranks may then get an empty last batch, which a data-parallel step cannot take).

DROP is counted by crossdali's loaders over DALI's PARTIAL, not left to DALI's iterator: DALI 2.4's
DROP leaves a shard's padded last batch in the pipeline when ``samples // shards`` is a multiple of
the batch size and the shards are unequal, and that batch then opens the next epoch (repeated samples;
``crossdali.common.loading.dali_loader.DALIIteratorLoader._iterator_policy``).
"""

from __future__ import annotations

import logging
import math

from nvidia.dali.plugin.base_iterator import LastBatchPolicy

__all__ = ["LastBatchPolicy", "choose_last_batch_policy", "batches_per_epoch", "batch_sizes", "samples_left_out"]

log = logging.getLogger(__name__)

_BY_NAME = {"partial": LastBatchPolicy.PARTIAL, "drop": LastBatchPolicy.DROP, "fill": LastBatchPolicy.FILL}


def choose_last_batch_policy(*, train: bool, num_shards: int, policy: str | None = None) -> LastBatchPolicy:
    """The policy for an epoch (see the module docstring). ``policy`` overrides by name."""
    if policy is not None:
        if policy not in _BY_NAME:
            raise ValueError(f"last-batch policy must be one of {sorted(_BY_NAME)}, got {policy!r}")
        return _BY_NAME[policy]
    return LastBatchPolicy.DROP if train and num_shards > 1 else LastBatchPolicy.PARTIAL


def samples_left_out(num_samples: int, *, batch_size: int, num_shards: int, policy: LastBatchPolicy) -> int:
    """How many samples one epoch skips under ``policy`` (0 for PARTIAL)."""
    if policy != LastBatchPolicy.DROP:
        return 0
    per_shard_min = num_samples // num_shards
    return num_samples - (per_shard_min // batch_size) * batch_size * num_shards


def batches_per_epoch(num_samples: int, *, batch_size: int, num_shards: int, policy: LastBatchPolicy) -> int:
    """Batches each shard yields per epoch (an upper bound for PARTIAL: empty ones are skipped)."""
    if policy == LastBatchPolicy.DROP:
        return (num_samples // num_shards) // batch_size
    return math.ceil(math.ceil(num_samples / num_shards) / batch_size)


def batch_sizes(num_samples: int, *, batch_size: int, shard_id: int, num_shards: int,
                policy: LastBatchPolicy) -> list[int]:
    """The sizes of the batches shard ``shard_id`` yields per epoch, as crossdali's DALI loaders yield
    them: DROP and FILL full batches only; PARTIAL the shard's samples (DALI's sharding: samples
    ``num_samples * shard_id // num_shards`` up to the next shard's first) in full batches and a short
    last one, without the empty batch a shorter shard ends with. What a synthetic loader must yield to
    be the data loaders' ceiling step for step, short step included."""
    if policy != LastBatchPolicy.PARTIAL:
        return [batch_size] * batches_per_epoch(num_samples, batch_size=batch_size, num_shards=num_shards,
                                                policy=policy)
    shard = num_samples * (shard_id + 1) // num_shards - num_samples * shard_id // num_shards
    full, rest = divmod(shard, batch_size)
    return [batch_size] * full + ([rest] if rest else [])


def log_epoch_plan(name: str, num_samples: int, *, batch_size: int, num_shards: int, policy: LastBatchPolicy,
                   pipelines: int = 1) -> None:
    """One line at start-up: samples, shards, batch, last-batch rule, and what the rule leaves out.
    With ``pipelines`` per shard (``crossdali.common.options.sub_shard_options``) each pipeline is a
    shard of its own with ``batch_size / pipelines`` samples per step, which is what the count uses."""
    left = samples_left_out(num_samples, batch_size=batch_size // pipelines, num_shards=num_shards * pipelines,
                            policy=policy)
    shards = f"{num_shards} shard(s)" + (f" x {pipelines} pipelines" if pipelines > 1 else "")
    msg = f"{name}: {num_samples} samples, {shards}, batch {batch_size}, last batch {policy.name}"
    if left:
        msg += f"; {left} sample{'' if left == 1 else 's'} left out per epoch (a different set each epoch)"
    log.info(msg)
