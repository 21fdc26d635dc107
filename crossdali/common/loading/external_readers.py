"""The readers that feed ``fn.external_source`` from a user's source, one per kind of source
(``crossdali.common.external`` says which kind is which): ``IndexedSamples`` reads per sample,
``StreamBatches`` per stream, ``ShardBatches`` per store shard. Each keeps crossdali's epoch rules
(``crossdali.common.loading.epochs``) and turns a user's item into DALI's inputs (``to_sample``),
refusing a sample that is not an image DALI decodes with the sample named.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from crossdali.common.data.sources import sniff_image_bytes
from crossdali.common.errors import DataError
from crossdali.common.loading.epochs import LastBatchPolicy

__all__ = ["IndexedSamples", "ShardBatches", "StreamBatches", "rank_shards", "sharded_limit", "to_sample"]


def to_sample(item: Any, *, index: int | str, name: str, num_classes: int,
              multi_label: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """One user sample ``(encoded, label)`` as DALI's inputs: uint8 bytes (1-D) and int64 label (1,);
    with ``multi_label`` the label is the sample's class indices (any number, none included) and
    becomes a float32 multi-hot vector of ``num_classes``.

    Raises ``DataError`` naming the sample for anything else: a wrong shape of item, an image
    format DALI cannot decode, a label outside ``[0, num_classes)``.
    """
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        raise DataError(f"sample {index} of {name} is a {type(item).__name__}, not a pair (encoded image bytes, "
                        "integer label); map your source's items to (bytes, int)")
    encoded, label = item
    if isinstance(encoded, np.ndarray) and encoded.dtype == np.uint8 and encoded.ndim == 1:
        data = encoded
    elif isinstance(encoded, (bytes, bytearray, memoryview)):
        data = np.frombuffer(encoded, dtype=np.uint8)
    else:
        what = f"{encoded.dtype} array of shape {encoded.shape}" if isinstance(encoded, np.ndarray) \
            else type(encoded).__name__
        raise DataError(f"sample {index} of {name}: the image is a {what}; give the encoded file's bytes (bytes, "
                        "bytearray, memoryview or a 1-D uint8 numpy array), not decoded pixels")
    problem = sniff_image_bytes(data[:16].tobytes())
    if problem is not None:
        raise DataError(f"sample {index} of {name} is {problem}; DALI decodes JPEG, PNG, BMP, TIFF, JPEG 2000, WebP "
                        "and PNM: re-encode it (e.g. PIL: Image.open(...).convert('RGB').save(buf, 'JPEG')) "
                        "or leave it out of the source")
    if multi_label:
        return data, _multi_hot(label, index=index, name=name, num_classes=num_classes)
    try:
        value = int(label)
    except (TypeError, ValueError):
        raise DataError(f"sample {index} of {name}: label {label!r} is not an integer") from None
    if not 0 <= value < num_classes:
        raise DataError(f"sample {index} of {name}: label {value} is outside [0, num_classes={num_classes}); "
                        "pass the right num_classes or fix the label")
    return data, np.array([value], dtype=np.int64)


def _multi_hot(label: Any, *, index: int | str, name: str, num_classes: int) -> np.ndarray:
    try:
        classes = np.asarray(label, dtype=np.int64).reshape(-1)
    except (TypeError, ValueError):
        raise DataError(f"sample {index} of {name}: labels {label!r} are not class indices (a list of integers)") \
            from None
    if classes.size and (classes.min() < 0 or classes.max() >= num_classes):
        raise DataError(f"sample {index} of {name}: labels {classes.tolist()} are not all in [0, "
                        f"num_classes={num_classes}); pass the right num_classes or fix the labels")
    hot = np.zeros(num_classes, dtype=np.float32)
    hot[classes] = 1.0
    return hot


class IndexedSamples:
    """``fn.external_source`` callable (``batch=False``): ``SampleInfo`` -> (encoded, label) of this shard.

    Stateless (the sample is a pure function of ``info.epoch_idx`` and ``info.idx_in_epoch``), so
    DALI may run it in worker processes and restore it from a checkpoint. The epoch's order is a
    global permutation (``seed``, epoch) cut into contiguous shards, like ``ShardSampler``. The
    shard's last batch is padded with its last sample (as ``pad_last_batch`` does for readers:
    DALI drops a batch in which the source stopped early); the wrapper trims the padding, using
    ``samples_in_epoch``. ``epoch_offset`` shifts the epoch numbers (a resume without a DALI
    checkpoint starts DALI at epoch 0).
    """

    def __init__(self, get: Callable[[int], Any], *, num_samples: int, num_classes: int, batch_size: int,
                 shard_id: int, num_shards: int, shuffle: bool, seed: int, policy: LastBatchPolicy,
                 name: str, epoch_offset: int = 0, multi_label: bool = False) -> None:
        self.get, self.num_samples, self.num_classes, self.name = get, num_samples, num_classes, name
        self.multi_label = multi_label
        self.batch_size, self.shard_id, self.num_shards = batch_size, shard_id, num_shards
        self.shuffle, self.seed, self.policy, self.epoch_offset = shuffle, seed, policy, epoch_offset
        lo, hi = shard_id * num_samples // num_shards, (shard_id + 1) * num_samples // num_shards
        self.lo, self.hi = lo, hi
        if policy == LastBatchPolicy.DROP:
            self.samples_in_epoch = (num_samples // num_shards) // batch_size * batch_size
        else:
            self.samples_in_epoch = hi - lo
        self.padded = math.ceil(self.samples_in_epoch / batch_size) * batch_size
        self._order_epoch, self._order = None, None

    def shard_order(self, epoch: int) -> np.ndarray:
        """Dataset indices this shard reads in ``epoch`` (before padding), in reading order."""
        if self._order_epoch != epoch:
            order = np.arange(self.num_samples)
            if self.shuffle:
                order = np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)
            self._order_epoch, self._order = epoch, order[self.lo:self.hi][:self.samples_in_epoch]
        return self._order

    def __call__(self, info) -> tuple[np.ndarray, np.ndarray]:
        if info.idx_in_epoch >= self.padded:
            raise StopIteration
        order = self.shard_order(info.epoch_idx + self.epoch_offset)
        i = int(order[min(info.idx_in_epoch, len(order) - 1)])
        return to_sample(self.get(i), index=i, name=self.name, num_classes=self.num_classes,
                         multi_label=self.multi_label)


class StreamBatches:
    """``fn.external_source`` generator function (``batch=True``, ``cycle="raise"``): one epoch of a
    stream per call, in batches of up to ``batch_size`` (a partial last batch is kept unless
    ``limit`` cuts the epoch to whole batches).

    ``batched``: the stream yields whole batches ``(encoded list, labels)`` instead of samples.
    ``stride``: keep items ``shard_id, shard_id + num_shards, ...`` (for streams that cannot shard
    themselves). ``limit``: samples per epoch this rank must deliver (equal step counts across
    ranks): the epoch stops there, and a stream that ends earlier is an error. ``skip``: batches
    to leave out at the start of the first epoch (resuming mid-epoch).
    """

    def __init__(self, stream: Iterable | Callable[[], Iterable], *, batch_size: int, num_classes: int, name: str,
                 batched: bool = False, stride: tuple[int, int] | None = None, limit: int | None = None,
                 skip: int = 0, multi_label: bool = False) -> None:
        self.stream, self.batch_size, self.num_classes, self.name = stream, batch_size, num_classes, name
        self.multi_label = multi_label
        self.batched, self.stride, self.limit, self.skip = batched, stride, limit, skip
        self.one_shot = not callable(stream) and iter(stream) is stream
        self._calls = 0

    def _samples(self):
        items = self.stream() if callable(self.stream) else self.stream
        it = iter(items)
        if self.stride is not None and self.stride[1] > 1:
            it = itertools.islice(it, self.stride[0], None, self.stride[1])
        return it

    def _user_batches(self):
        """The stream as batches of (index, item) pairs."""
        n = 0
        if self.batched:
            for b, batch in enumerate(self._samples()):
                if not isinstance(batch, (tuple, list)) or len(batch) != 2 or len(batch[0]) != len(batch[1]):
                    raise DataError(f"batch {b} of {self.name} is not (list of encoded images, labels) of equal "
                                    "lengths; with batched=True the stream must yield whole batches")
                if len(batch[0]) > self.batch_size:
                    raise DataError(f"batch {b} of {self.name} holds {len(batch[0])} samples, more than "
                                    f"batch_size={self.batch_size}; batch the stream to at most batch_size")
                yield [(n + k, pair) for k, pair in enumerate(zip(batch[0], batch[1]))]
                n += len(batch[0])
        else:
            it = enumerate(self._samples())
            while chunk := list(itertools.islice(it, self.batch_size)):
                yield chunk

    def __call__(self):
        first, self._calls = self._calls == 0, self._calls + 1
        if not first and self.one_shot:
            raise DataError(f"{self.name} is a one-shot iterator (a generator object): it has no second epoch. "
                            "Pass a re-iterable (a list, a Squirrel Composable) or a generator function instead")
        skip = self.skip if first else 0
        delivered = 0
        for b, chunk in enumerate(self._user_batches()):
            if self.limit is not None:
                chunk = chunk[:self.limit - delivered]
                if not chunk:
                    break
            delivered += len(chunk)
            if b < skip:
                continue
            samples = [to_sample(item, index=i, name=self.name, num_classes=self.num_classes,
                                 multi_label=self.multi_label) for i, item in chunk]
            yield [s[0] for s in samples], [s[1] for s in samples]
        if self.limit is not None and delivered < self.limit:
            raise DataError(f"{self.name} gave {delivered} samples on this rank, fewer than the {self.limit} every rank "
                            "must give per epoch (from num_samples); pass the stream's true length as num_samples")


def rank_shards(num_shards_in_store: int, rank: int, world: int) -> range:
    """The store shards rank ``rank`` of ``world`` reads: ``rank, rank + world, ...``."""
    return range(rank, num_shards_in_store, world)


def sharded_limit(sizes: tuple[int, ...], *, batch_size: int, rank: int, world: int,
                  policy: LastBatchPolicy) -> int:
    """Samples per epoch rank ``rank`` delivers from a sharded source: all of its shards' samples,
    or (``DROP``) the whole batches the smallest rank can fill, so every rank takes as many steps."""
    if policy == LastBatchPolicy.DROP:
        smallest = min(sum(sizes[s] for s in rank_shards(len(sizes), r, world)) for r in range(world))
        return smallest // batch_size * batch_size
    return sum(sizes[s] for s in rank_shards(len(sizes), rank, world))


class ShardBatches:
    """``fn.external_source`` callable (``batch=True``, ``batch_info=True``): ``BatchInfo`` -> one
    batch of a sharded source (``source.shard_sizes``, ``source.read_shard(i)`` -> that shard's
    ``(encoded, label)`` items; ``source.keys`` names the shards in errors when it has them).

    An epoch on this rank is the samples of its shards (``rank_shards``), one shard after the
    other; training reshuffles the shard order and the order inside each shard from (``seed``,
    epoch), val keeps the store's order. Batch ``b`` is samples ``[b * batch_size, (b + 1) *
    batch_size)`` of that sequence, cut at ``limit`` (``sharded_limit``): a pure function of the
    epoch and ``b``, so DALI's worker processes build different batches with no shared state, and
    DALI's checkpoint restores the position. A batch reads every shard it overlaps whole; the last
    ``cache`` shards read are kept per process, since consecutive batches often share one.
    """

    def __init__(self, source: Any, *, batch_size: int, num_classes: int, name: str, shard_id: int, num_shards: int,
                 shuffle: bool, seed: int, policy: LastBatchPolicy, epoch_offset: int = 0, multi_label: bool = False,
                 cache: int = 2) -> None:
        self.source, self.batch_size, self.num_classes, self.name = source, batch_size, num_classes, name
        self.sizes = tuple(int(n) for n in source.shard_sizes)
        self.mine = tuple(rank_shards(len(self.sizes), shard_id, num_shards))
        self.shuffle, self.seed, self.epoch_offset, self.multi_label = shuffle, seed, epoch_offset, multi_label
        self.limit = sharded_limit(self.sizes, batch_size=batch_size, rank=shard_id, world=num_shards, policy=policy)
        self.cache = cache
        self._layout_epoch, self._layout = None, None
        self._read: dict[int, list] = {}  # shard -> items, the most recently read last

    def _epoch_layout(self, epoch: int) -> tuple[list[int], list[int]]:
        """This rank's shards in reading order and the epoch position where each starts."""
        if self._layout_epoch != epoch:
            order = list(self.mine)
            if self.shuffle:
                order = [order[i] for i in np.random.default_rng([self.seed, epoch]).permutation(len(order))]
            starts = np.concatenate([[0], np.cumsum([self.sizes[s] for s in order])[:-1]]).tolist() if order else []
            self._layout_epoch, self._layout = epoch, (order, starts)
        return self._layout

    def _shard_name(self, shard: int) -> str:
        keys = getattr(self.source, "keys", None)  # SquirrelSource.keys: the store's shard names
        return f"shard {keys[shard]!r}" if isinstance(keys, (tuple, list)) else f"shard {shard}"

    def _items(self, shard: int) -> list:
        if shard in self._read:
            self._read[shard] = self._read.pop(shard)  # most recently used last
        else:
            items = list(self.source.read_shard(shard))
            if len(items) != self.sizes[shard]:
                raise DataError(f"{self._shard_name(shard)} of {self.name} holds {len(items)} samples, not the "
                                f"{self.sizes[shard]} counted when the loader was built: was the store rewritten "
                                "while training? Build the loader again")
            self._read[shard] = items
            while len(self._read) > self.cache:
                self._read.pop(next(iter(self._read)))
        return self._read[shard]

    def __call__(self, info) -> tuple[list[np.ndarray], list[np.ndarray]]:
        epoch = info.epoch_idx + self.epoch_offset
        start = info.iteration * self.batch_size
        stop = min(start + self.batch_size, self.limit)
        if start >= stop:
            raise StopIteration
        order, starts = self._epoch_layout(epoch)
        k = bisect.bisect_right(starts, start) - 1
        encoded, labels = [], []
        while start < stop:
            shard, first = order[k], starts[k]
            items = self._items(shard)
            inner = np.random.default_rng([self.seed, epoch, shard]).permutation(len(items)) if self.shuffle \
                else np.arange(len(items))
            end = min(stop - first, len(items))
            for j in inner[start - first:end]:
                data, label = to_sample(items[j], index=f"{j} of {self._shard_name(shard)}", name=self.name,
                                        num_classes=self.num_classes, multi_label=self.multi_label)
                encoded.append(data)
                labels.append(label)
            start, k = first + end, k + 1
        return encoded, labels
