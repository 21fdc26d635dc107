"""Squirrel (``squirrel-core``) as a stream for ``fn.external_source``: the worked example of
``crossdali.common.external``, after the DALI + Squirrel tutorial.

A ``MessagepackDriver`` store holds shards (gzip'd msgpack files) of ``{"key", "image": JPEG
bytes, "label": int}`` samples. ``write_squirrel_store`` writes one from a crossdali
``DataSource`` (the sample set); ``SquirrelSource`` streams it as ``(bytes, label)`` pairs, and
shards itself by store shard (``shard(rank, world)``: rank ``r`` reads shards ``r, r + world,
...``), so every sample is read by exactly one rank and no rank reads another's bytes.

Squirrel is imported only when a store is written or read (``pip install squirrel-core``).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["SquirrelSource", "write_squirrel_store"]


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

    Re-iterable (each ``iter`` reads the store again: one epoch) and picklable (DALI's ``spawn``
    workers). ``max_workers`` threads fetch shards ahead (Squirrel's ``async_map``; 1: in order,
    one at a time). ``num_classes`` is what the loader reports. ``shard(i, n)`` gives the source
    restricted to every n-th store shard from i; ``keys`` restricts it explicitly.
    """

    def __init__(self, url: str | Path, *, num_classes: int, max_workers: int | None = 1,
                 keys: tuple[str, ...] | None = None) -> None:
        self.url, self.num_classes, self.max_workers = str(url), num_classes, max_workers
        self._keys = keys

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
