"""One sample order per epoch whatever the number of ranks, so a job resumes mid-epoch on another count.

The default train order (``crossdali.common.classification``) is DALI's: each reader shuffles the whole
dataset with the seed and cuts it into ``num_shards`` contiguous shards, and its checkpoint is a
position inside its own shard. Both depend on the world size, so a job checkpointed on 2 ranks cannot
continue that epoch on 1 or 4. With the global order (``--global-order``, ``global_order=True``):

- epoch ``e`` reads ``epoch_permutation(n, seed, e)``, one permutation of the whole dataset that
  depends on the seed and the epoch only;
- rank ``r`` of ``N`` reads its positions ``start + r, start + r + N, ...`` (``rank_positions``), so after
  ``b`` steps of batch ``B`` the ranks together have read exactly positions ``start .. start + N*b*B - 1``;
- a checkpoint records that global position (``resume_point``), and a job on ``M`` ranks continues the
  epoch from it, rank ``r`` reading ``position + r, position + r + M, ...``: over the whole epoch every
  position, hence every sample, is read once (last-batch rule ``partial``).

With ``drop`` (the default of several ranks, ``crossdali.common.loading.epochs``) each rank reads the
same whole number of batches from ``start``: the epoch's last ``< world * batch`` positions of the
permutation are left out, a different set of samples each epoch. An epoch resumed on ``M`` ranks
applies that rule to the positions that remain, so it leaves out fewer than ``M * batch`` samples
and still reads none twice.

The images are read by ``GlobalOrderFiles`` (an ``fn.external_source`` callable that names the files
of each batch) and ``fn.io.file.read``: DALI's file reader cannot be told an order, only a shard.
The callable is a pure function of DALI's epoch and iteration numbers, so DALI's own checkpoint
restores it exactly on the same number of ranks (augmentation state included).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["GlobalOrder", "GlobalOrderFiles", "epoch_permutation", "rank_positions", "resume_point",
           "GLOBAL_ORDER_FORMATS"]

#: data layouts the global order reads (image files named one by one; records are read by shard)
GLOBAL_ORDER_FORMATS = ("imagefolder", "filelist")


@dataclass(frozen=True)
class GlobalOrder:
    """Where a pipeline in the global order starts: ``epoch`` (the loader's epoch when DALI's epoch is 0)
    and ``start`` (the global position that epoch starts at; later epochs start at 0); ``drop_last``:
    each rank reads only whole batches (the ``drop`` rule)."""

    drop_last: bool = False
    epoch: int = 0
    start: int = 0

    def __post_init__(self) -> None:
        if self.epoch < 0 or self.start < 0:
            raise ValueError(f"global order epoch and start must be >= 0, got {self.epoch}, {self.start}")


def epoch_permutation(num_samples: int, *, seed: int, epoch: int) -> np.ndarray:
    """The dataset indices in the order epoch ``epoch`` reads them: a function of (seed, epoch) alone."""
    return np.random.default_rng([seed & 0xFFFF_FFFF, epoch]).permutation(num_samples)


def rank_positions(num_samples: int, *, start: int, rank: int, world: int, batch_size: int,
                   drop_last: bool) -> range:
    """The positions of the epoch's permutation that rank ``rank`` of ``world`` reads from ``start`` on:
    ``start + rank``, then every ``world``-th; with ``drop_last`` only as many as fill the same whole number
    of batches on every rank (so the ranks together read the prefix ``start .. start + world * that - 1``)."""
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, world={world}), got {rank}")
    if drop_last:
        per_rank = max(0, num_samples - start) // world // batch_size * batch_size
        return range(start + rank, start + rank + per_rank * world, world)
    return range(start + rank, max(start + rank, num_samples), world)


def resume_point(states: Sequence[dict], *, num_samples: int) -> tuple[int, int]:
    """(epoch, global position) where the next epoch's reading starts, from the ``global_order`` parts
    of every rank's loader state saved at one moment (``DALIIteratorLoader.state_dict``).

    Rank ``r`` had read ``consumed[r]`` of its positions since ``start``; the ranks' reads form the prefix
    up to ``start + sum(consumed)`` only when no rank is ahead of a lower one (``consumed`` non-increasing
    and at most one apart), which is how ranks that step together read. Anything else is refused
    (``ValueError``): no single position would continue it without repeating or skipping samples.
    """
    parts = [s["global_order"] for s in states]
    if len(parts) != parts[0]["world"]:
        raise ValueError(f"a resume needs the loader states of all {parts[0]['world']} ranks, got {len(parts)}")
    epoch, start = parts[0]["epoch"], parts[0]["start"]
    if any(p["epoch"] != epoch or p["start"] != start for p in parts):
        raise ValueError("the ranks' loader states were saved in different epochs: save them at one step")
    consumed = [int(p["consumed"]) for p in parts]
    if any(a < b for a, b in zip(consumed, consumed[1:])) or consumed[0] - consumed[-1] > 1:
        raise ValueError(f"the ranks had read {consumed} samples of the epoch, not in step: no single position "
                         "continues that epoch without repeating or skipping samples")
    position = start + sum(consumed)
    drop_last = bool(parts[0]["drop_last"])
    world, batch_size = parts[0]["world"], parts[0]["batch_size"]
    end = start + len(rank_positions(num_samples, start=start, rank=0, world=world, batch_size=batch_size,
                                     drop_last=drop_last)) * world if drop_last else num_samples
    if position >= end:
        return epoch + 1, 0
    return epoch, position


class GlobalOrderFiles:
    """``fn.external_source`` callable (``batch=True, batch_info=True``, two outputs): the file paths (as
    uint8 bytes, for ``fn.io.file.read``) and int64 labels of rank ``rank``'s next batch in the global
    order; ``StopIteration`` at the end of its epoch. A pure function of DALI's ``BatchInfo``, so DALI
    may call it ahead and restore it from a checkpoint."""

    def __init__(self, files: Sequence[str], labels: Sequence[int], *, seed: int, rank: int, world: int,
                 batch_size: int, order: GlobalOrder) -> None:
        self.paths = [np.frombuffer(str(f).encode("utf-8"), dtype=np.uint8) for f in files]
        self.labels = np.asarray(labels, dtype=np.int64).reshape(-1, 1)
        self.seed, self.rank, self.world, self.batch_size, self.order = seed, rank, world, batch_size, order
        self._epoch, self._positions, self._permutation = None, range(0), None

    def positions(self, epoch_idx: int) -> range:
        """Positions this rank reads in DALI's epoch ``epoch_idx`` (the loader's ``order.epoch + epoch_idx``)."""
        start = self.order.start if epoch_idx == 0 else 0
        return rank_positions(len(self.paths), start=start, rank=self.rank, world=self.world,
                              batch_size=self.batch_size, drop_last=self.order.drop_last)

    def __call__(self, info):
        if self._epoch != info.epoch_idx:
            self._epoch, self._positions = info.epoch_idx, self.positions(info.epoch_idx)
            self._permutation = epoch_permutation(len(self.paths), seed=self.seed,
                                                  epoch=self.order.epoch + info.epoch_idx)
        mine = self._positions[info.iteration * self.batch_size:(info.iteration + 1) * self.batch_size]
        if len(mine) == 0:
            raise StopIteration
        index = self._permutation[mine.start:mine.stop:mine.step]
        return [self.paths[i] for i in index], [self.labels[i] for i in index]
