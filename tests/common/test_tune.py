"""``crossdali tune`` on the CPU: real DALI trials on the tiny sample set within a small budget, the tune file
it writes, a training script that takes its values for the flags not given (and says so), an explicit flag
that wins, and one-line errors for a user's mistakes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from crossdali.common.scripts.defaults import resolve_defaults
from crossdali.common.scripts.script_parsers import PARSERS
from crossdali.common.tune import (
    KNOBS,
    Grid,
    Machine,
    Trial,
    TuneResult,
    TuneSettings,
    default_grid,
    default_settings,
    detect_machine,
    read_tune,
    run_until_steady,
    tune,
    tune_key,
    write_tune,
)

BUDGET = 5.0


def _env(cache, data_root) -> dict:
    return {**os.environ, "CROSSDALI_CACHE": str(cache), "CROSSDALI_DATA": str(data_root), "OMP_NUM_THREADS": "2"}


def _tune(*argv: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "crossdali", "tune", *argv], env=env, capture_output=True, text=True,
                          timeout=300)


def test_tune_measures_within_the_budget_and_writes_the_file(tmp_path, data_root, tiny_classification):
    data = tiny_classification / "imagefolder"
    t0 = time.perf_counter()
    proc = _tune("--data", str(data), "--data-backend", "dali-cpu", "-b", "16", "--crop-size", "32",
                 "--budget", str(BUDGET), env=_env(tmp_path, data_root))
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    trials = [line for line in lines if line.startswith("trial ")]
    assert trials and "(defaults)" in trials[0] and "-j 4, hw 1, pipelines 1, prefetch 2" in trials[0]
    assert all("images/s" in line for line in trials)
    chosen, = [line for line in lines if line.startswith("chosen: ")]
    written, = [line for line in lines if line.startswith("written: ")]
    files = list((tmp_path / "tune").glob("*.json"))
    assert len(files) == 1 and str(files[0]) in written
    content = json.loads(files[0].read_text())
    assert content["key"] == {"data": str(data.resolve()), "backend": "dali-cpu", "batch_size": 16, "crop_size": 32,
                              "gpu": detect_machine().gpu, "cpus": detect_machine().cpus}
    assert set(content["settings"]) == set(KNOBS) and content["noise_margin"] == 0.03
    assert content["defaults"] == {"workers": 4, "hw_decoder_load": 1.0, "pipelines": 1, "prefetch": 2}
    assert len(content["trials"]) == len(trials) and all(t["images_per_s"] > 0 for t in content["trials"])
    assert TuneSettings(**content["settings"]).label() in chosen
    # the trials stop at the budget (one step and a teardown past it at most); the rest is Python and DALI starting
    assert content["seconds"] <= BUDGET + 3.0
    assert wall < BUDGET + 30.0
    # never slower than the defaults by the search's own measurements: a change needs a 3 % win
    if content["settings"] != content["defaults"]:
        assert content["images_per_s"] > content["defaults_images_per_s"] * 1.03


def test_the_grid_starts_from_the_defaults_and_stays_small():
    gpu = Machine(gpu="NVIDIA H200", hardware_jpeg_decoder=True, cpus=16)
    assert default_settings("dali-gpu", gpu) == TuneSettings(workers=15, hw_decoder_load=1.0, pipelines=1, prefetch=2)
    grid = default_grid("dali-gpu", gpu, 256)
    assert grid == Grid(workers=(4, 8, 12, 15), hw_decoder_load=(1.0, 0.8, 0.6), pipelines=(1, 2, 4), prefetch=(1, 2, 3))
    assert grid.size() == len(list(grid.configs())) == 108  # the benchmark's exhaustive sweep: minutes, not hours
    cpu = Machine(gpu=None, hardware_jpeg_decoder=False, cpus=2)
    assert default_grid("dali-cpu", cpu, 30) == Grid(workers=(1, 2, 4), hw_decoder_load=(1.0,), pipelines=(1, 2),
                                                     prefetch=(1, 2, 3))


def _landscape(rates: dict[TuneSettings, float]):
    """A ``measure`` that answers from measured rates (the search itself is under test, not DALI's speed)."""
    def measure_fn(source, settings, **kw) -> Trial:
        return Trial(settings=settings, images_per_s=rates[settings], seconds=0.0, batches=1)
    return measure_fn


def _interacting(settings: TuneSettings) -> float:
    """Rates shaped as the H200's were (results/latest/tune.json's rounds): a second pipeline alone gains 2 %, the
    CUDA decoder's share loses on one pipeline and wins on two, threads do nothing, a deeper prefetch 1 %."""
    share = {1.0: 1.0, 0.8: 0.85, 0.6: 0.6} if settings.pipelines == 1 else {1.0: 1.0, 0.8: 1.08, 0.6: 0.9}
    pipes = {1: 1.0, 2: 1.02, 4: 0.97}[settings.pipelines]
    return 100.0 * pipes * share[settings.hw_decoder_load] * {1: 0.9, 2: 1.0, 3: 1.01}[settings.prefetch]


def test_the_search_follows_knobs_that_pay_only_together():
    # a search that asks every step for a 3 % win, or tries the decoder share before the pipelines, stays at the
    # defaults here (the H200 run of benchmarks/tune.py chose a configuration at 86 % of the best that way)
    gpu = Machine(gpu="NVIDIA H200", hardware_jpeg_decoder=True, cpus=16)
    rates = {c: _interacting(c) for c in default_grid("dali-gpu", gpu, 256).configs()}
    lines: list[str] = []
    result = tune(None, backend="dali-gpu", batch_size=256, crop_size=224, budget_s=60.0, machine=gpu,
                  measure_fn=_landscape(rates), report=lines.append)
    assert rates[result.best] == max(rates.values()), "\n".join(lines)
    assert (result.best.pipelines, result.best.hw_decoder_load, result.best.prefetch) == (2, 0.8, 3)
    assert result.confirmed and "(defaults, again)" in lines[-2] and "(choice, again)" in lines[-1]
    # one trial per grid value off the start, a second window for each that read close below the best (4 pipelines,
    # share 0.6, prefetch 1 and the three thread counts, which change nothing here), and the second look
    assert len(result.trials) == 1 + 9 + 6 + 2
    assert sum("(again)" in line for line in lines) == 6


def test_one_slow_window_does_not_hide_the_fastest_configuration():
    # the H200 run of benchmarks/tune.py read the fastest configuration's only window 22 % low and chose one at 91.5 %
    # of the best; a second window for a candidate close below the best finds it again
    gpu = Machine(gpu="NVIDIA H200", hardware_jpeg_decoder=True, cpus=16)
    rates = {c: _interacting(c) for c in default_grid("dali-gpu", gpu, 256).configs()}
    unlucky = TuneSettings(workers=15, hw_decoder_load=0.8, pipelines=2, prefetch=2)
    first_look = iter([0.8 * rates[unlucky]])

    def slow_once(source, settings, **kw) -> Trial:
        rate = next(first_look, rates[settings]) if settings == unlucky else rates[settings]
        return Trial(settings=settings, images_per_s=rate, seconds=0.0, batches=1)

    lines: list[str] = []
    result = tune(None, backend="dali-gpu", batch_size=256, crop_size=224, budget_s=60.0, machine=gpu,
                  measure_fn=slow_once, report=lines.append)
    assert rates[result.best] == max(rates.values()), "\n".join(lines)
    assert any("hw 0.8, pipelines 2, prefetch 2" in line and "(again)" in line for line in lines)


def test_one_slow_build_does_not_end_the_search():
    # a trial's cost is estimated from the builds so far: by their median, one slow build (the H200 run had one of
    # 8.6 s among builds of about 5) does not make every later trial look too dear to fit the budget
    gpu = Machine(gpu="NVIDIA H200", hardware_jpeg_decoder=True, cpus=16)
    rates = {c: _interacting(c) for c in default_grid("dali-gpu", gpu, 256).configs()}
    reported = iter([1.0, 1.0, 30.0])  # the third trial reports a 30 s build; the others 1 s (no time really passes)

    def one_slow(source, settings, **kw) -> Trial:
        return Trial(settings=settings, images_per_s=rates[settings], seconds=next(reported, 1.0), batches=1)

    result = tune(None, backend="dali-gpu", batch_size=256, crop_size=224, budget_s=60.0, machine=gpu,
                  measure_fn=one_slow, report=lambda line: None)
    assert rates[result.best] == max(rates.values()) and len(result.trials) == 1 + 9 + 6 + 2


def test_a_configuration_is_searched_once():
    # threads come last: once 1 thread beats the default 4, the grid's next value 4 would be the defaults again;
    # the search skips it (the defaults are measured again only in the second look)
    cpu = Machine(gpu=None, hardware_jpeg_decoder=False, cpus=2)
    grid = default_grid("dali-cpu", cpu, 32)
    defaults = default_settings("dali-cpu", cpu)
    assert defaults.workers == 4 and grid.workers == (1, 2, 4)
    rates = {c: 150.0 if c.workers == 1 else 100.0 for c in grid.configs()}
    lines: list[str] = []
    result = tune(None, backend="dali-cpu", batch_size=32, crop_size=32, budget_s=10.0, machine=cpu, grid=grid,
                  measure_fn=_landscape(rates), report=lines.append)
    assert result.best == replace(defaults, workers=1), "\n".join(lines)
    assert [t.settings for t in result.trials].count(defaults) == 2, "\n".join(lines)
    assert "(defaults, again)" in lines[-2]


def test_the_search_keeps_the_defaults_where_nothing_wins_by_the_margin():
    cpu = Machine(gpu=None, hardware_jpeg_decoder=False, cpus=2)
    grid = default_grid("dali-cpu", cpu, 32)
    defaults = default_settings("dali-cpu", cpu)
    # every other configuration 2 % faster than the defaults: within the noise margin, so no change
    rates = {c: 102.0 for c in grid.configs()} | {defaults: 100.0}
    result = tune(None, backend="dali-cpu", batch_size=32, crop_size=32, budget_s=10.0, machine=cpu, grid=grid,
                  measure_fn=_landscape(rates), report=lambda line: None)
    assert result.best == defaults and result.best_images_per_s == 100.0
    # a first window of the defaults slowed by a cold file cache does not decide: the second look does
    slow_first = iter([70.0])
    def cold(source, settings, **kw) -> Trial:
        rate = next(slow_first, rates[settings]) if settings == defaults else rates[settings]
        return Trial(settings=settings, images_per_s=rate, seconds=0.0, batches=1)
    result = tune(None, backend="dali-cpu", batch_size=32, crop_size=32, budget_s=10.0, machine=cpu, grid=grid,
                  measure_fn=cold, report=lambda line: None)
    assert result.confirmed and result.best == defaults and result.defaults_images_per_s == 100.0


class _Clock:
    """Time that passes only as the steps take it: the warm-up's rule is under test, not this machine's timing
    (real sleeps on a busy machine make spans look faster or slower at random)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _stepper(clock: _Clock, slow_s: float, ramp_s: float, fast_s: float):
    """A step whose time falls from ``slow_s`` to ``fast_s`` over its first ``ramp_s`` seconds: a pipeline warming
    up."""
    start = clock.now

    def step() -> None:
        t = clock.now - start
        clock.now += fast_s if t >= ramp_s else slow_s - (slow_s - fast_s) * t / ramp_s
    return step, start


def test_the_warm_up_lasts_until_the_rate_stops_climbing():
    # a rate that doubles over 0.4 s: spans of 0.1 s go on while it climbs, and the last two are on the steady rate
    clock = _Clock()
    step, start = _stepper(clock, 0.004, 0.4, 0.002)
    assert run_until_steady(step, 0.1, deadline=float("inf"), max_extra=8, clock=clock) == 6
    assert clock.now - start >= 0.4 + 2 * 0.1
    # a steady rate: two spans
    step, _ = _stepper(clock, 0.002, 1e-9, 0.002)
    assert run_until_steady(step, 0.1, deadline=float("inf"), max_extra=8, clock=clock) == 2
    # a rate that doubles every span, past every check: 2 + max_extra spans
    begin = clock.now

    def doubling() -> None:
        clock.now += 0.004 * 0.5 ** ((clock.now - begin) / 0.1)
    assert run_until_steady(doubling, 0.1, deadline=float("inf"), max_extra=3, clock=clock) == 5
    # the deadline ends it: no span starts after it, the last one stops at its first step past it
    step, start = _stepper(clock, 0.004, 10.0, 0.002)
    assert run_until_steady(step, 0.1, deadline=start + 0.15, max_extra=8, clock=clock) == 2
    assert start + 0.15 <= clock.now < start + 0.15 + 0.004


def _write(cache, monkeypatch, data, settings: TuneSettings, *, batch: int, crop: int, backend: str = "dali-cpu"):
    monkeypatch.setenv("CROSSDALI_CACHE", str(cache))
    defaults = default_settings(backend, detect_machine())
    result = TuneResult(best=settings, defaults=defaults, best_images_per_s=200.0, defaults_images_per_s=100.0)
    return write_tune(tune_key(data, backend, batch, crop, detect_machine()), result, budget_s=BUDGET)


def test_an_explicit_flag_wins_over_the_tune_file(tmp_path, monkeypatch, tiny_classification):
    data = tiny_classification / "imagefolder"
    path = _write(tmp_path, monkeypatch, data, TuneSettings(workers=3, hw_decoder_load=1.0, pipelines=2, prefetch=3),
                  batch=32, crop=32)
    assert read_tune(data, "dali-cpu", 32, 32) == (path, TuneSettings(3, 1.0, 2, 3))
    assert read_tune(data, "dali-cpu", 64, 32) is None  # another batch: another key
    parser = PARSERS[("classification", "pytorch")]()
    argv = ["--data", str(data), "--data-backend", "dali-cpu", "-b", "32", "--crop-size", "32"]

    taken = parser.parse_args(argv)
    resolved = resolve_defaults(taken, cuda=False, argv=argv)
    assert (taken.workers, taken.pipelines, taken.prefetch_queue_depth, resolved.tuned, resolved.tune_file) == \
        (3, 2, 3, ("workers", "pipelines", "prefetch_queue_depth"), str(path))
    assert f"-j 3 (tuned); workers, pipelines, prefetch_queue_depth from crossdali tune: {path}" in resolved.line()

    explicit = [*argv, "-j", "2", "--pipelines", "1"]
    given = parser.parse_args(explicit)
    resolved = resolve_defaults(given, cuda=False, argv=explicit)
    assert (given.workers, given.pipelines, resolved.tuned) == (2, 1, ("prefetch_queue_depth",))  # no flag for it
    assert resolved.record()["tune_file"] == str(path) and "workers" not in resolved.auto


@pytest.mark.slow
def test_a_training_run_takes_the_tuned_values_and_says_so(tmp_path, monkeypatch, data_root, tiny_classification):
    pytest.importorskip("torch")
    from crossdali.common.scripts.metrics import read_metrics

    data = tiny_classification / "imagefolder"
    path = _write(tmp_path / "cache", monkeypatch, data,
                  TuneSettings(workers=3, hw_decoder_load=1.0, pipelines=2, prefetch=2), batch=32, crop=32)
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "crossdali.pytorch.train_classification", "--data", str(data),
                           "--data-backend", "dali-cpu", "-b", "32", "--crop-size", "32", "--arch", "small_cnn",
                           "--epochs", "1", "--print-freq", "0", "--skip-check", "--output-dir", str(out)],
                          env=_env(tmp_path / "cache", data_root), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"-j 3 (tuned); workers, pipelines, prefetch_queue_depth from crossdali tune: {path}" in proc.stderr
    assert "1 shard(s) x 2 pipelines" in proc.stderr
    start, = [r for r in read_metrics(out) if r["event"] == "start"]
    assert (start["workers"], start["pipelines"], start["tune_file"], start["tuned"]) == \
        (3, 2, str(path), ["workers", "pipelines", "prefetch_queue_depth"])


@pytest.mark.parametrize("argv, words", [
    (["--data", "/no/such/dataset"], "--data /no/such/dataset does not exist"),
    (["--data", "{tiny}", "--data-backend", "dali-gpu"], "--data-backend dali-gpu needs a CUDA GPU"),
    (["--data", "{tiny}/train"], "no train split found"),
])
def test_a_mistake_is_one_line_and_exit_2(argv, words, tmp_path, data_root, tiny_classification):
    if "dali-gpu" in argv and detect_machine().gpu is not None:
        pytest.skip("a GPU is visible here")
    argv = [a.replace("{tiny}", str(tiny_classification / "imagefolder")) for a in argv]
    proc = _tune(*argv, "--budget", "1", env=_env(tmp_path, data_root))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("crossdali tune: error: ") and words in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "tune").exists()


@pytest.mark.slow
def test_the_benchmark_runs_on_the_cpu(tmp_path, data_root, tiny_classification, repo_root):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.tune", "--cpu", "--smoke", "--out", str(tmp_path)],
                          env=_env(tmp_path / "cache", data_root), cwd=repo_root, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "tune_cpu.json").read_text())
    assert report["backend"] == "dali-cpu" and report["gpu"] is None and report["cpu"]
    assert report["sweep"]["complete"] and report["sweep"]["configs"] == report["sweep"]["of"] == 27
    tuned = [r for r in report["rounds"]["configs"] if r["tuned"]]
    assert len(tuned) == 1 and [r for r in report["rounds"]["configs"] if r["defaults"]]
    assert 0 < report["tuned_share"]["of_medians"] <= 1 and report["tuned_share"]["rounds"] == 2
    trials = report["tune"]["trial_rates"]
    assert len(trials) == report["tune"]["trials"] and all(t["images_per_s"] > 0 for t in trials)
    assert {k: trials[0][k] for k in ("workers", "hw_decoder_load", "pipelines", "prefetch")} == report["defaults"]
    assert not (tmp_path / "cache" / "tune").exists()  # the benchmark writes no tune file


@pytest.mark.gpu
def test_tune_on_a_gpu_searches_the_decoder_share_within_the_budget(tmp_path, data_root, tiny_classification):
    machine = detect_machine()
    if machine.gpu is None:
        pytest.skip("no GPU visible (nvidia-smi lists none)")
    budget = 20.0
    proc = _tune("--data", str(tiny_classification / "imagefolder"), "--data-backend", "dali-gpu", "-b", "64",
                 "--crop-size", "64", "--budget", str(budget), env=_env(tmp_path, data_root))
    assert proc.returncode == 0, proc.stderr[-3000:]
    content = json.loads(next((tmp_path / "tune").glob("*.json")).read_text())
    assert content["key"]["backend"] == "dali-gpu" and content["key"]["gpu"] == machine.gpu
    assert content["seconds"] <= budget + 5.0
    if machine.hardware_jpeg_decoder:
        assert any(t["hw_decoder_load"] != 1.0 for t in content["trials"]), proc.stdout
