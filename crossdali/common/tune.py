"""``crossdali tune``: the loader settings that are fastest on this machine for one dataset, found in a time budget.

The DALI settings a training script leaves to defaults (DALI threads ``-j``, the hardware-decoder share
``--hw-decoder-load``, ``--pipelines`` and DALI's prefetch depth) are measured here on the shared
classification train pipeline itself (``crossdali.common.classification``, run with ``pipeline.run()``,
no framework imported), for one dataset, backend, batch size and crop size on this machine:

1. today's defaults are the first candidate and the first "best";
2. coordinate search, one knob at a time over its grid (``Grid``) in ``SEARCH_ORDER``: each trial builds the
   pipeline(s), runs a warm-up that lasts until the rate stops climbing (``run_until_steady``), then times a
   fixed short window; a candidate faster than the best so far replaces it. Knobs interact: on a GPU the CUDA
   decoder's share pays only once several pipelines feed the decoders, and a second pipeline alone gains
   little, so the search takes pipelines before the share and follows any gain; threads come last, as the
   default already uses all cores but one and they matter least where the hardware decoder does most of the
   work (docs/benchmarks.md#tune);
3. a window read on a busy machine is mostly too slow, rarely too fast, so a configuration's estimate is its
   best window, and a candidate that reads below the best by less than ``RECHECK_BAND`` gets a second window
   before it is passed over (one slow window of the fastest configuration cost an earlier search its target);
4. the defaults and the choice are measured once more (the search keeps the time for these two trials) and
   the choice is kept only if its mean beats the defaults' better window by more than ``NOISE_MARGIN`` (3 %),
   so noise alone never moves the choice away from the defaults (the defaults' first window may also have
   read cold files). Where the second look does not fit, the single windows must show that margin.

No trial starts once the budget cannot hold it, and the result is always written: at worst the defaults.
The result goes to a small JSON file under ``$CROSSDALI_CACHE/tune`` (default ``~/.cache/crossdali/tune``)
named by a hash of the resolved data path, backend, batch size, crop size, GPU model and CPU count
(``tune_file``); ``crossdali.common.scripts.defaults.resolve_defaults`` reads it for every flag the user did
not give (docs/tuning.md).
"""

from __future__ import annotations

import gc
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from crossdali.common.errors import UsageError
from crossdali.common.scripts.tune_files import (
    KNOBS,
    TUNE_VERSION,
    Machine,
    TuneSettings,
    detect_machine,
    read_tune,
    tune_dir,
    tune_file,
    tune_key,
)

__all__ = ["NOISE_MARGIN", "RECHECK_BAND", "SEARCH_ORDER", "TUNE_VERSION", "KNOBS",
           "TuneSettings", "Grid", "Trial", "TuneResult", "Machine",
           "detect_machine", "default_settings", "default_grid", "tune_dir", "tune_key", "tune_file", "read_tune",
           "run_until_steady", "measure", "tune", "write_tune", "main"]

#: a candidate must beat the defaults by more than this share of their rate to replace them
NOISE_MARGIN = 0.03
#: a candidate this share or less below the best so far gets a second window before it is passed over
RECHECK_BAND = 0.2
#: a trial's warm-up goes on while a span's rate beats the span before by more than this share ...
RAMP_TOLERANCE = 0.03
#: ... for at most this many more spans (``run_until_steady``)
RAMP_CHECKS = 4
#: the order the coordinate search takes the knobs in (module docstring: pipelines before the decoder share,
#: threads last)
SEARCH_ORDER = ("pipelines", "hw_decoder_load", "prefetch", "workers")



@dataclass(frozen=True)
class Grid:
    """The values each knob may take (the first of each is never implied: ``default_settings`` is the start)."""

    workers: tuple[int, ...]
    hw_decoder_load: tuple[float, ...]
    pipelines: tuple[int, ...]
    prefetch: tuple[int, ...]

    def values(self, knob: str) -> tuple:
        return getattr(self, knob)

    def size(self) -> int:
        n = 1
        for knob in KNOBS:
            n *= len(self.values(knob))
        return n

    def configs(self) -> Iterator[TuneSettings]:
        """Every combination (the exhaustive sweep of ``benchmarks/tune.py``)."""
        for w in self.workers:
            for h in self.hw_decoder_load:
                for p in self.pipelines:
                    for q in self.prefetch:
                        yield TuneSettings(workers=w, hw_decoder_load=h, pipelines=p, prefetch=q)


@dataclass(frozen=True)
class Trial:
    settings: TuneSettings
    images_per_s: float
    seconds: float  #: the whole trial: build, warm-up and timed window
    batches: int  #: timed batches


@dataclass
class TuneResult:
    best: TuneSettings
    defaults: TuneSettings
    best_images_per_s: float
    defaults_images_per_s: float
    trials: list[Trial] = field(default_factory=list)
    seconds: float = 0.0
    confirmed: bool = False  #: the choice was measured against the defaults a second time

    @property
    def speedup(self) -> float:
        return self.best_images_per_s / self.defaults_images_per_s if self.defaults_images_per_s else 1.0


def default_settings(backend: str, machine: Machine) -> TuneSettings:
    """What a training script uses today without flags: ``-j`` from the machine (``default_workers``; on a
    GPU machine the CUDA rule), the hardware decoder for every JPEG, one pipeline, DALI's prefetch of 2."""
    from crossdali.common.scripts.defaults import default_workers

    return TuneSettings(workers=default_workers(cuda=machine.gpu is not None, cpus=machine.cpus),
                        hw_decoder_load=1.0, pipelines=1, prefetch=2)


def default_grid(backend: str, machine: Machine, batch_size: int) -> Grid:
    """The values searched: threads at a quarter, half, three quarters and all of the CPUs, and the default (a
    value one thread from the default is left out: it would cost a trial and tell little); hardware-decoder
    shares only on a GPU with that decoder; 1, 2 or 4 pipelines where they divide the batch; prefetch depths
    1 to 3. On a 16-CPU machine with a hardware decoder that is 4 x 3 x 3 x 3 = 108 configurations."""
    base = default_settings(backend, machine)
    cpus = machine.cpus
    fractions = {max(1, round(cpus * f)) for f in (0.25, 0.5, 0.75, 1.0)}
    workers = sorted({w for w in fractions if abs(w - base.workers) > 1} | {base.workers})
    hw = (1.0, 0.8, 0.6) if backend == "dali-gpu" and machine.hardware_jpeg_decoder else (base.hw_decoder_load,)
    pipelines = tuple(p for p in (1, 2, 4) if batch_size % p == 0 and batch_size // p >= 1)
    return Grid(workers=tuple(workers), hw_decoder_load=hw, pipelines=pipelines, prefetch=(1, 2, 3))


def _train_source(data: Path):
    from crossdali.common.data.sources import resolve_source

    return resolve_source(data, "train")


def run_until_steady(step: Callable[[], object], half_s: float, deadline: float, *,
                     max_extra: int = RAMP_CHECKS, tolerance: float = RAMP_TOLERANCE,
                     clock: Callable[[], float] = time.perf_counter) -> int:
    """Run ``step`` in spans of ``half_s`` seconds (at least one step each): two spans, then more while the last
    span's rate still beats the one before by more than ``tolerance``, at most ``max_extra`` more; stops at
    ``deadline`` (a ``clock`` time). Returns the spans run. A pipeline whose rate still climbs is timed only once it
    has stopped climbing: a hardware-decoder share below 1 reads low in windows under a second
    (docs/benchmarks.md#tune)."""
    def rate() -> float:
        t0, n = clock(), 0
        end = min(t0 + half_s, deadline)
        while True:
            step()
            n += 1
            if clock() >= end:
                return n / (clock() - t0)

    previous, spans = rate(), 1
    while clock() < deadline and spans < 2 + max_extra:
        current = rate()
        spans += 1
        if current <= previous * (1 + tolerance):
            break
        previous = current
    return spans


def measure(source, settings: TuneSettings, *, backend: str, batch_size: int, crop_size: int,
            warmup_s: float, window_s: float, deadline: float, device_id: int = 0, until_steady: bool = False) -> Trial:
    """Images per second of the classification train pipeline(s) with ``settings``.

    Builds ``settings.pipelines`` pipelines that together give ``batch_size`` images a step (as the
    loaders split a shard, ``sub_shard_options``), runs ``warmup_s`` untimed (at least one step; with
    ``until_steady``, longer while the rate still climbs: ``run_until_steady``), then times steps for
    ``window_s`` (at least one); GPU outputs are copied to the host at the end of the warm-up and of the
    window so that the queued GPU work is inside the time. Both phases end early at ``deadline``
    (``time.perf_counter``)."""
    from crossdali.common.classification import ClassificationTransform, create_classification_pipeline
    from crossdali.common.options import pipeline_options, sub_shard_options

    t0 = time.perf_counter()
    options = pipeline_options(backend, batch_size=batch_size, device_id=device_id, workers=settings.workers,
                               hw_decoder_load=settings.hw_decoder_load, checkpointing=True,  # as the train loaders
                               prefetch_queue_depth=settings.prefetch)
    transform = ClassificationTransform(crop_size=crop_size)
    pipes = [create_classification_pipeline(source, train=True, options=o, transform=transform)
             for o in sub_shard_options(options, settings.pipelines)]
    try:
        for pipe in pipes:
            pipe.build()

        def step():
            return [pipe.run() for pipe in pipes]

        def sync(outputs) -> None:
            for images, _ in outputs:
                if hasattr(images, "as_cpu"):
                    images.as_cpu()

        sync(step())
        if until_steady:
            run_until_steady(step, warmup_s / 2, deadline)
        else:
            end = min(time.perf_counter() + warmup_s, deadline)
            while time.perf_counter() < end:
                step()
        sync(step())
        start = time.perf_counter()
        end = min(start + window_s, deadline)
        batches = 0
        while True:
            outputs = step()
            batches += 1
            if time.perf_counter() >= end:
                break
        sync(outputs)
        elapsed = time.perf_counter() - start
    finally:
        pipes.clear()  # DALI frees a pipeline's threads and buffers when it is dropped
        gc.collect()
    return Trial(settings=settings, images_per_s=batches * batch_size / elapsed, seconds=time.perf_counter() - t0,
                 batches=batches)


def tune(source, *, backend: str, batch_size: int, crop_size: int, budget_s: float, machine: Machine,
         grid: Grid | None = None, margin: float = NOISE_MARGIN, device_id: int = 0,
         report: Callable[[str], None] = print, measure_fn: Callable[..., Trial] | None = None) -> TuneResult:
    """Coordinate search from ``default_settings`` over ``grid`` in at most ``budget_s`` (module docstring).

    Args:
        source: the resolved train split (``resolve_source(data, "train")``).
        backend: ``dali-gpu`` or ``dali-cpu``.
        batch_size, crop_size: what the training run uses (the tuned values are for these).
        budget_s: seconds for all trials; none starts once the time left cannot hold it.
        machine: ``detect_machine()``; decides the defaults and the grid.
        grid: the values per knob (default ``default_grid``).
        margin: a candidate must be this share faster than the defaults to replace them.
        report: called with one line per trial and the outcome.
        measure_fn: what times one trial, ``measure``'s signature (default ``measure``: the real pipelines).
    """
    import crossdali.common.classification  # noqa: F401 - DALI's import is startup, not the first trial's time

    t_start = time.perf_counter()
    deadline = t_start + budget_s
    defaults = default_settings(backend, machine)
    grid = grid or default_grid(backend, machine, batch_size)
    off_start = sum(len([v for v in grid.values(k) if v != getattr(defaults, k)]) for k in KNOBS)
    # the defaults, one trial per grid value off the start, second windows for about half of them, the second look
    planned = 1 + off_start + (off_start + 1) // 2 + 2
    window = min(3.0, max(0.2, budget_s / (planned * 1.9)))  # first guess: a trial costs about 1.9 windows
    trials: list[Trial] = []
    windows: list[float] = []

    def build_cost() -> float:
        # a trial costs its build (pipelines, GPU memory: seconds on a GPU) plus 1.5 windows; the median build so far
        # is what the next may cost (the first also starts DALI's singletons once: left out when possible). The median,
        # not the slowest: one slow build would otherwise make every later trial look too dear and end the search early
        builds = [max(0.0, t.seconds - 1.5 * w) for t, w in zip(trials, windows)]
        builds = sorted(builds[1:] or builds)
        return builds[(len(builds) - 1) // 2]  # the lower median: of two, the cheaper

    def next_window() -> float:
        # once two builds are known, the window shrinks so that every planned trial fits the budget
        if len(trials) < 2:
            return window
        left = max(1, planned - len(trials))
        return min(window, max(0.2, ((deadline - time.perf_counter()) / left - build_cost()) / 1.5))

    measure_one = measure_fn or measure

    def run(settings: TuneSettings, note: str = "", *, keep: int = 0) -> Trial | None:
        # keep: trials whose time must stay free after this one (the second look at the end)
        w = next_window()
        if trials and time.perf_counter() + (1 + keep) * (build_cost() + 1.5 * w) > deadline:
            return None
        trial = measure_one(source, settings, backend=backend, batch_size=batch_size, crop_size=crop_size,
                        warmup_s=w / 2, window_s=w, deadline=deadline, device_id=device_id, until_steady=True)
        windows.append(w)
        trials.append(trial)
        report(f"trial {len(trials):2d}: {settings.label():<48} {trial.images_per_s:10,.0f} images/s  "
               f"({trial.seconds:.1f} s){note}")
        return trial

    first = run(defaults, "  (defaults)")
    best, best_rate = defaults, first.images_per_s
    out_of_time = False
    for knob in SEARCH_ORDER:
        for value in grid.values(knob):
            if value == getattr(best, knob):
                continue
            candidate = replace(best, **{knob: value})
            if any(t.settings == candidate for t in trials):  # the best before this knob moved: already beaten
                continue
            trial = run(candidate, keep=2)
            if trial is None:
                out_of_time = True
                break
            rate = trial.images_per_s
            if best_rate * (1 - RECHECK_BAND) <= rate <= best_rate:  # close below the best: one window may be unlucky
                again = run(candidate, "  (again)", keep=2)
                if again is None:
                    out_of_time = True
                rate = max(rate, again.images_per_s if again else 0.0)
            if rate > best_rate:  # no margin here: the second look below applies it
                best, best_rate = candidate, rate
            if out_of_time:
                break
        if out_of_time:
            break
    defaults_rate = max(t.images_per_s for t in trials if t.settings == defaults)
    confirmed = False
    if best != defaults:  # a second look at both, so one lucky window does not decide
        again_default, again_best = run(defaults, "  (defaults, again)"), None
        if again_default is not None:
            again_best = run(best, "  (choice, again)")
        if again_default is not None and again_best is not None:
            # the defaults at their better window (the first may have read cold files), the choice at its mean
            defaults_rate = max(defaults_rate, again_default.images_per_s)
            best_rate = (best_rate + again_best.images_per_s) / 2
            confirmed = True
        if best_rate <= defaults_rate * (1 + margin):  # with or without the second look: a 3 % win or the defaults
            best, best_rate = defaults, defaults_rate
    return TuneResult(best=best, defaults=defaults, best_images_per_s=best_rate, defaults_images_per_s=defaults_rate,
                      trials=trials, seconds=time.perf_counter() - t_start, confirmed=confirmed)


def write_tune(key: dict, result: TuneResult, *, budget_s: float, margin: float = NOISE_MARGIN) -> Path:
    """The tune file of ``key`` (written whole, then renamed into place)."""
    path = tune_file(key)
    content = {
        "version": TUNE_VERSION, "key": key, "settings": asdict(result.best),
        "images_per_s": round(result.best_images_per_s, 1), "defaults": asdict(result.defaults),
        "defaults_images_per_s": round(result.defaults_images_per_s, 1), "noise_margin": margin,
        "confirmed": result.confirmed, "budget_s": budget_s, "seconds": round(result.seconds, 2),
        "trials": [{**asdict(t.settings), "images_per_s": round(t.images_per_s, 1), "seconds": round(t.seconds, 2)}
                   for t in result.trials],
        "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(content, indent=2) + "\n")
    tmp.replace(path)
    return path


def add_tune_args(parser) -> None:
    """``crossdali tune``'s flags (also the benchmark's)."""
    from crossdali.common.options import DALI_BACKENDS

    parser.add_argument("--data", type=Path, required=True,
                        help="the dataset folder, as passed to a training script's --data (its train split is read)")
    parser.add_argument("--data-backend", choices=DALI_BACKENDS, default=None,
                        help="default: dali-gpu where a GPU is visible, else dali-cpu")
    parser.add_argument("-b", "--batch-size", type=int, default=None,
                        help="batch per process, as the training run uses (default: the training scripts' default here)")
    parser.add_argument("--crop-size", type=int, default=224, help="training crop, pixels")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds for all trials")


def resolve_args(args) -> tuple[str, int, Machine]:
    """The backend, batch size and machine of parsed ``tune`` flags; a ``UsageError`` for a bad path or a
    GPU backend without a GPU."""
    from crossdali.common.scripts.defaults import CPU_BATCH_SIZE, GPU_BATCH_SIZE

    if not args.data.exists():
        raise UsageError(f"--data {args.data} does not exist; pass the folder of your dataset (the one a training "
                         "script's --data gets)")
    if not args.data.is_dir():
        raise UsageError(f"--data {args.data} is not a folder; pass the folder of your dataset")
    if args.budget <= 0:
        raise UsageError(f"--budget {args.budget:g} must be positive (seconds)")
    machine = detect_machine()
    backend = args.data_backend or ("dali-gpu" if machine.gpu else "dali-cpu")
    if backend == "dali-gpu" and machine.gpu is None:
        raise UsageError("--data-backend dali-gpu needs a CUDA GPU and none is visible (nvidia-smi lists none); "
                         "use --data-backend dali-cpu")
    batch = args.batch_size or (GPU_BATCH_SIZE if machine.gpu else CPU_BATCH_SIZE)
    if batch < 1 or args.crop_size < 1:
        raise UsageError("-b and --crop-size must be positive")
    return backend, batch, machine


def main(args) -> int:
    """``crossdali tune``: measure, print one line per trial, write the tune file and say where."""
    backend, batch, machine = resolve_args(args)
    source = _train_source(args.data)
    where = f"{machine.gpu}, " if machine.gpu else ""
    print(f"tuning {backend} on {args.data} (train split, {source.num_samples} samples), batch {batch}, crop "
          f"{args.crop_size}, {where}{machine.cpus} CPUs, budget {args.budget:g} s; a change must be "
          f"{NOISE_MARGIN:.0%} faster than the best so far")
    sys.stdout.flush()
    result = tune(source, backend=backend, batch_size=batch, crop_size=args.crop_size, budget_s=args.budget,
                  machine=machine, report=lambda line: print(line, flush=True))
    key = tune_key(args.data, backend, batch, args.crop_size, machine)
    path = write_tune(key, result, budget_s=args.budget)
    verdict = "the defaults stay" if result.best == result.defaults else f"{result.speedup:.2f}x the defaults"
    print(f"chosen: {result.best.label()}: {result.best_images_per_s:,.0f} images/s ({verdict}; "
          f"{len(result.trials)} trials in {result.seconds:.1f} s)")
    print(f"written: {path} (training scripts with this --data, backend, -b and --crop-size use it for every "
          "setting not given on the command line)")
    return 0
