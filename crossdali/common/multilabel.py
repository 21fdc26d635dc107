"""Multi-label classification from a list file: ``path label_a label_b ...`` per image.

The labels of an image are any number of classes (none included), given as class names or as
class indices; a ``.csv`` list has the path in its first column and labels in the others (a cell
may hold several, separated by spaces). Class names are sorted (as ImageFolder sorts its folders)
unless a ``classes.txt`` beside the list, or ``classes=``, fixes their order.

DALI's file reader carries one integer label per file, so the list is fed through crossdali's
external-source pipeline (``crossdali.common.external``): ``MultiLabelSource`` is an indexed source
(``len`` + ``[i]`` -> the file's bytes and its class indices), read in DALI's Python workers,
decoded and augmented by the same ``augment_classification`` graph as every other source, and
delivered with float32 multi-hot labels. Sharding, the epoch rule and mid-epoch resume are the
external-source loader's.
"""

from __future__ import annotations

import csv
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Imported here, not inside the function that uses it: measured, a lazy import of scikit-learn (it
# imports scipy.stats) deadlocked when the garbage collector closed a DALI Python-worker pool of an
# old loader in the middle of that import (the pool's close joins a thread that needs the import lock).
from sklearn.metrics import average_precision_score, f1_score

from crossdali.common.data.check.exclude import Exclusions, load_exclusions
from crossdali.common.data.sources import validate_files
from crossdali.common.errors import DataError, UsageError

__all__ = ["MultiLabelSource", "gathered_multilabel_stats", "multilabel_loader_args", "multilabel_metrics",
           "read_multilabel_list",
           "resolve_multilabel_source", "resolve_multilabel_splits"]

log = logging.getLogger(__name__)

_HEADER_WORDS = {"path", "file", "filename", "image", "image_path", "img"}


@dataclass(frozen=True)
class MultiLabelSource:
    """One split of a multi-label list, ready for ``create_external_source_loader(multi_label=True)``."""

    list_path: Path
    files: tuple[str, ...]
    labels: tuple[tuple[int, ...], ...]
    classes: tuple[str, ...]
    format: str = "multilabel"

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def num_samples(self) -> int:
        return len(self.files)

    @property
    def root(self) -> Path:
        return self.list_path.parent

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[np.ndarray, tuple[int, ...]]:
        return np.fromfile(self.files[i], dtype=np.uint8), self.labels[i]

    def __repr__(self) -> str:  # the loaders' logs and errors name the list, not 2 million files
        return f"MultiLabelSource('{self.list_path}', {len(self.files)} images, {len(self.classes)} classes)"

    def label_matrix(self) -> np.ndarray:
        """(samples, classes) multi-hot, for class frequencies and tests."""
        hot = np.zeros((len(self.files), len(self.classes)), dtype=np.float32)
        for row, classes in enumerate(self.labels):
            hot[row, list(classes)] = 1.0
        return hot


def _rows(list_path: Path) -> list[tuple[int, str, list[str]]]:
    """(line number, path, label tokens) of every non-empty, non-comment line."""
    text = list_path.read_text(encoding="utf-8")
    rows = []
    if list_path.suffix.lower() == ".csv":
        for n, cells in enumerate(csv.reader(text.splitlines()), 1):
            if cells and cells[0].strip() and not cells[0].lstrip().startswith("#"):
                rows.append((n, cells[0].strip(), [t for c in cells[1:] for t in c.split()]))
    else:
        for n, line in enumerate(text.splitlines(), 1):
            parts = line.split()
            if parts and not parts[0].startswith("#"):
                rows.append((n, parts[0], parts[1:]))
    if rows and rows[0][1].lower() in _HEADER_WORDS:
        rows = rows[1:]  # a header row ("path,labels")
    return rows


def read_multilabel_list(list_path: str | Path, *, root: str | Path | None = None,
                         classes: list[str] | tuple[str, ...] | None = None, validate: bool = True,
                         exclude=None, max_pixels: int | None = None) -> MultiLabelSource:
    """Read a multi-label list; paths are relative to ``root`` (default: the list's folder).

    ``classes``: the class names in label order (default: ``classes.txt`` beside the list, one
    name a line; else the sorted names found in the list; integer labels need neither). Raises
    ``DataError`` naming the line for a missing file or a label outside the classes, and runs the
    fast data check over the images (``validate``). ``exclude``: an exclusion list of
    ``crossdali check`` (or sample paths) to leave out.
    """
    list_path = Path(list_path)
    if not list_path.is_file():
        raise DataError(f"multi-label list {list_path} does not exist; expected lines '<image path> <label> "
                        "<label> ...' (or a .csv with the path first)")
    root = Path(root) if root is not None else list_path.parent
    rows = _rows(list_path)
    if not rows:
        raise DataError(f"multi-label list {list_path} lists no images")
    if classes is None and (list_path.parent / "classes.txt").is_file():
        classes = [c.strip() for c in (list_path.parent / "classes.txt").read_text().splitlines() if c.strip()]
    tokens = {t for _, _, labels in rows for t in labels}
    numeric = classes is None and all(t.isdigit() for t in tokens)
    if numeric:
        names = tuple(str(i) for i in range(max((int(t) for t in tokens), default=-1) + 1))
    else:
        names = tuple(classes) if classes is not None else tuple(sorted(tokens))
    index = {name: i for i, name in enumerate(names)}
    # exclusions first, so that a listed image that is gone can be left out by an exclusion list
    exclusions = load_exclusions(exclude) or Exclusions()
    files, labels = [], []
    for n, rel, row_labels in rows:
        path = Path(rel) if Path(rel).is_absolute() else root / rel
        if not path.is_file() and not exclusions.excludes_file(str(path)):
            raise DataError(f"{list_path}:{n}: {path} does not exist; restore it, remove its line, or leave it out "
                            "with an exclusion list that names it (--exclude FILE)")
        try:
            ids = tuple(sorted({int(t) if numeric else index[t] for t in row_labels}))
        except KeyError as e:
            raise DataError(f"{list_path}:{n}: label {e.args[0]!r} is not one of the {len(names)} classes in "
                            f"{list_path.parent / 'classes.txt'}; add it there or fix the line") from None
        files.append(str(path))
        labels.append(ids)
    if exclusions:
        keep = [i for i, f in enumerate(files) if not exclusions.excludes_file(f)]
        log.warning("%s: excluded %d of %d images listed in %s", list_path, len(files) - len(keep), len(files),
                    exclusions.origin or "exclude=")
        files, labels = [files[i] for i in keep], [labels[i] for i in keep]
        if not files:
            raise DataError(f"{list_path}: the exclusion list excludes every image; nothing to train on")
    if not names:
        raise DataError(f"multi-label list {list_path} names no labels at all; expected '<image path> <label> ...'")
    if validate:
        validate_files(files, root=root, where=str(list_path), max_pixels=max_pixels)
    return MultiLabelSource(list_path=list_path, files=tuple(files), labels=tuple(labels), classes=names)


def multilabel_metrics(scores: np.ndarray, targets: np.ndarray, *, threshold: float = 0.5) -> dict[str, float]:
    """Mean average precision over the classes that occur in ``targets`` (scikit-learn's
    ``average_precision_score``; a class with no positive sample has no AP), and the macro F1 of
    ``scores >= threshold`` (probabilities), in percent."""
    present = targets.sum(axis=0) > 0
    ap = average_precision_score(targets[:, present], scores[:, present], average=None) if present.any() else []
    f1 = f1_score(targets, scores >= threshold, average="macro", zero_division=0)
    return {"map": 100 * float(np.mean(ap)) if len(ap) else 0.0, "f1": 100 * float(f1),
            "classes_scored": int(present.sum())}


def gathered_multilabel_stats(loss_sum: float, scores: list, targets: list, *, num_classes: int,
                              runtime) -> dict[str, float]:
    """Val loss, mAP and macro F1 over every rank's samples: ``scores``/``targets`` are this rank's
    batches (sigmoid probabilities, multi-hot), ``loss_sum`` its summed per-sample loss; the rows
    are gathered (``runtime.gather_rows``, since average precision ranks the whole val set) and the
    loss summed (``runtime.all_reduce_sum``). For the scripts whose runtimes gather by sum (MXNet,
    TensorFlow)."""
    mine = np.concatenate([np.concatenate(scores), np.concatenate(targets)], axis=1) if scores \
        else np.zeros((0, 2 * num_classes), np.float32)
    both = runtime.gather_rows(mine)
    (loss_sum,) = runtime.all_reduce_sum([loss_sum])
    seen = len(both)
    stats = {"val_loss": loss_sum / max(seen, 1), "val_samples": int(seen)}
    if not seen:
        return stats
    found = multilabel_metrics(both[:, :num_classes], both[:, num_classes:])
    return stats | {"val_map": found["map"], "val_f1": found["f1"]}


def resolve_multilabel_source(data: str | Path, split: str, *, validate: bool = True, exclude=None,
                              classes: tuple[str, ...] | None = None) -> MultiLabelSource:
    """``data/<split>.txt`` or ``data/<split>.csv`` (or ``data`` itself when it is a list file).
    ``classes``: the label order to use (pass the train split's to val, which may lack a class)."""
    data = Path(data)
    kwargs = dict(validate=validate, exclude=exclude, classes=classes)
    if data.is_file():
        return read_multilabel_list(data, **kwargs)
    for name in (f"{split}.txt", f"{split}.csv"):
        if (data / name).is_file():
            return read_multilabel_list(data / name, **kwargs)
    raise DataError(f"no multi-label {split} list in {data}: expected {data / (split + '.txt')} or "
                    f"{data / (split + '.csv')} ('<image path> <label> <label> ...' per line)")


def multilabel_loader_args(data, *, train: bool, py_workers: int, exclude=None) -> tuple[MultiLabelSource, dict]:
    """The source of a split of a multi-label list (``data``: a folder, a list file or a
    ``MultiLabelSource``) and the arguments every framework's ``create_external_source_loader``
    takes for it besides the transform's: multi-hot labels, the class count, DALI's Python workers."""
    from crossdali.common.external import ExternalSourceOptions

    source = data if isinstance(data, MultiLabelSource) else \
        resolve_multilabel_source(data, "train" if train else "val", exclude=exclude)
    # spawn, not fork: measured here, a train and a val loader forking their workers in one process
    # (each fork copies the other pool's locks mid-use) hung in DALI's worker queue within an epoch
    feed = ExternalSourceOptions(parallel=py_workers > 0, py_workers=max(1, py_workers), py_start_method="spawn")
    return source, {"multi_label": True, "num_classes": source.num_classes, "name": repr(source), "feed": feed}


def resolve_multilabel_splits(args, data: str | Path, backend: str) -> tuple[MultiLabelSource, MultiLabelSource]:
    """The train and val lists of a training script's ``--multi-label`` run (``args``: its flags),
    val in train's label order; a flag that cannot work is a ``UsageError`` naming it."""
    if backend not in ("dali-cpu", "dali-gpu"):
        raise UsageError(f"--multi-label reads its lists through DALI: use --data-backend dali-cpu or dali-gpu, "
                         f"not {backend}")
    check = dict(exclude=args.exclude, validate=not args.skip_check)
    train = resolve_multilabel_source(data, "train", **check)
    # val in the train split's label order: a class that val happens to lack must not shift the others
    val = resolve_multilabel_source(data, "val", classes=train.classes, **check)
    if args.num_classes and args.num_classes != train.num_classes:
        raise UsageError(f"--num-classes {args.num_classes} but {train.list_path} has {train.num_classes} "
                         "classes; leave --num-classes out")
    return train, val
