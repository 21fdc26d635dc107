"""Squirrel (``squirrel-core``) as a stream for ``fn.external_source``: the worked example of
``crossdali.common.external``, after the DALI + Squirrel tutorial.

A ``MessagepackDriver`` store holds shards (gzip'd msgpack files) of ``{"key", "image": JPEG
bytes, "label": int}`` samples. ``write_squirrel_store`` writes one from a crossdali
``DataSource`` (the sample set). ``SquirrelSource`` gives it to the external-source loader as a
*sharded* source (``shard_sizes`` + ``read_shard``: ``crossdali.common.loading.external_readers.ShardBatches``),
so DALI's Python workers each read and unpack different store shards; rank ``r`` reads shards
``r, r + world, ...``, so every sample is read by exactly one rank and no rank reads another's
bytes. Iterating it (or ``shard(rank, world)``) streams it as ``(bytes, label)`` pairs, the way
the DALI + Squirrel tutorial feeds DALI.

Squirrel is imported only when a store is written or read (``pip install squirrel-core``).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = ["SquirrelSource", "write_squirrel_store"]

log = logging.getLogger(__name__)


def _driver(url: str):
    try:
        from squirrel.driver import MessagepackDriver  # defer: optional dependency
    except ImportError:
        raise ImportError("crossdali.common.squirrel needs Squirrel: pip install squirrel-core "
                          "(pinned in requirements/pytorch.txt)") from None
    return MessagepackDriver(url)


def write_squirrel_store(source, url: str | Path, *, samples_per_shard: int = 64) -> int:
    """Write ``source``'s files (a ``DataSource`` with ``files``/``labels``) as a Squirrel
    messagepack store at ``url``, in the source's order, ``samples_per_shard`` per shard. Returns
    the number of samples written."""
    if not source.files:
        raise ValueError(f"{source.root} holds {source.format} records; write a store from an ImageFolder or file list")
    if samples_per_shard < 1:
        raise ValueError(f"samples_per_shard must be positive, got {samples_per_shard}")
    driver = _driver(str(url))
    items = list(zip(source.files, source.labels))
    for s, start in enumerate(range(0, len(items), samples_per_shard)):
        shard = [{"key": f"{start + k:08d}", "image": Path(f).read_bytes(), "label": int(label)}
                 for k, (f, label) in enumerate(items[start:start + samples_per_shard])]
        driver.store.set(value=shard, key=f"shard-{s:05d}")
    return len(items)


def _pair(sample: dict) -> tuple[bytes, int]:
    return sample["image"], sample["label"]


class SquirrelSource:
    """The samples of a Squirrel messagepack store as ``(jpeg bytes, label)``, in shard-key order.

    A sharded source for the external-source loader: ``shard_sizes`` (samples per store shard,
    counted once by reading every shard in ``max_workers`` threads, unless given) and
    ``read_shard(i)``. Also re-iterable as a stream (each ``iter`` reads the store again: one
    epoch; ``max_workers`` threads fetch shards ahead, Squirrel's ``async_map``), and picklable
    (DALI's ``spawn`` workers; the sizes travel with it). ``num_classes`` is what the loader
    reports. ``shard(i, n)`` gives the source restricted to every n-th store shard from i;
    ``keys`` restricts it explicitly.
    """

    def __init__(self, url: str | Path, *, num_classes: int, max_workers: int | None = 1,
                 keys: tuple[str, ...] | None = None, shard_sizes: tuple[int, ...] | None = None) -> None:
        self.url, self.num_classes, self.max_workers = str(url), num_classes, max_workers
        self._keys = keys
        self._sizes = tuple(shard_sizes) if shard_sizes is not None else None
        if self._sizes is not None and keys is not None and len(self._sizes) != len(keys):
            raise ValueError(f"{len(self._sizes)} shard_sizes for {len(keys)} keys; give one size per shard")

    def read_shard(self, i: int) -> list[tuple[bytes, int]]:
        """The samples of store shard ``keys[i]``, in their stored order."""
        return [_pair(sample) for sample in _driver(self.url).store.get(self.keys[i])]

    @property
    def shard_sizes(self) -> tuple[int, ...]:
        if self._sizes is None:
            start = time.perf_counter()
            driver = _driver(self.url)
            with ThreadPoolExecutor(max(8, self.max_workers or 1)) as pool:
                self._sizes = tuple(pool.map(lambda key: sum(1 for _ in driver.store.get(key)), self.keys))
            log.info("%r: counted %d samples in %d shards in %.1f s (pass shard_sizes= to skip this)", self,
                     sum(self._sizes), len(self._sizes), time.perf_counter() - start)
        return self._sizes

    @property
    def keys(self) -> tuple[str, ...]:
        if self._keys is None:
            self._keys = tuple(sorted(_driver(self.url).keys()))
            if not self._keys:
                raise ValueError(f"Squirrel store {self.url} has no shards; write one with write_squirrel_store")
        return self._keys

    def shard(self, shard_id: int, num_shards: int) -> SquirrelSource:
        keys = self.keys[shard_id::num_shards]
        if not keys:
            raise ValueError(f"Squirrel store {self.url} has {len(self.keys)} shards, fewer than the {num_shards} ranks "
                             "reading it; write it with a smaller samples_per_shard")
        return SquirrelSource(self.url, num_classes=self.num_classes, max_workers=self.max_workers, keys=keys)

    def __iter__(self):
        it = _driver(self.url).get_iter(keys_iterable=list(self.keys), max_workers=self.max_workers, flatten=True)
        return iter(it.map(_pair))

    def __repr__(self) -> str:
        return f"SquirrelSource({self.url!r}, {len(self.keys)} shards)"
