"""The defaults a classification script takes from the machine (``resolve_defaults``): the fast
configuration where a CUDA GPU trains, today's float32 settings on the CPU, an explicit flag always
winning, and the learning rate scaled linearly from a global batch of 256; every framework's parser
leaves them to the machine and takes their off-switches."""

from __future__ import annotations

import logging

import pytest

from crossdali.common.scripts.defaults import (
    CPU_BATCH_SIZE,
    CPU_WORKERS,
    GPU_BATCH_SIZE,
    MAX_WORKERS,
    default_workers,
    local_process_count,
    resolve_defaults,
)
from crossdali.common.scripts.script_parsers import PARSERS

CLASSIFICATION = [framework for task, framework in PARSERS if task == "classification"]


def _args(framework: str = "pytorch", *argv: str):
    return PARSERS[("classification", framework)]().parse_args(list(argv))


@pytest.mark.parametrize("framework", CLASSIFICATION)
def test_every_classification_parser_leaves_the_fast_settings_to_the_machine(framework):
    args = _args(framework)
    assert (args.amp, args.channels_last, args.batch_size, args.workers, args.lr) == (None, None, None, None, 0.1)
    off = _args(framework, "--no-amp", "--no-channels-last")
    assert (off.amp, off.channels_last) == (False, False)
    on = _args(framework, "--amp", "--channels-last", "-b", "64", "-j", "3")
    assert (on.amp, on.channels_last, on.batch_size, on.workers) == (True, True, 64, 3)


def test_help_states_the_defaults_and_the_lr_rule():
    text = " ".join(PARSERS[("classification", "pytorch")]().format_help().split())
    assert f"default: {GPU_BATCH_SIZE} where a CUDA GPU trains" in text and f"{CPU_BATCH_SIZE} on the CPU" in text
    assert "lr x batch-size x processes / 256" in text and "Goyal" in text
    assert "--amp, --no-amp" in text and "--channels-last, --no-channels-last" in text
    assert "os.sched_getaffinity" in text


def test_cuda_resolves_to_the_fast_configuration(caplog):
    args = _args()
    with caplog.at_level(logging.INFO, logger="crossdali.common.scripts.defaults"):
        resolved = resolve_defaults(args, cuda=True, local_processes=1, cpus=16)
    assert (args.amp, args.channels_last, args.batch_size, args.workers) == (True, True, GPU_BATCH_SIZE, 15)
    assert (resolved.lr, resolved.lr_rule, resolved.memory_format) == (0.1, "0.1 x 256/256", "channels_last")
    assert resolved.auto == ("amp", "channels_last", "batch_size", "workers")
    assert resolved.record() == {"amp": True, "memory_format": "channels_last", "workers": 15, "lr_rule": "0.1 x 256/256",
                                 "auto_defaults": ["amp", "channels_last", "batch_size", "workers"], "cuda": True}
    line, = [r.getMessage() for r in caplog.records]
    assert line == ("run settings on the CUDA GPU: amp on (auto), memory format channels_last (auto), batch 256 per "
                    "process (auto), lr 0.1 = 0.1 x 256/256, -j 15 (auto)")


def test_cpu_keeps_the_float32_settings():
    args = _args()
    resolved = resolve_defaults(args, cuda=False, cpus=64)
    assert (args.amp, args.channels_last, args.batch_size, args.workers) == (False, False, CPU_BATCH_SIZE, CPU_WORKERS)
    assert (resolved.lr, resolved.lr_rule, resolved.memory_format) == (0.05, "0.1 x 128/256", "contiguous")


@pytest.mark.parametrize("cuda", [True, False])
def test_explicit_flags_win(cuda):
    args = _args("pytorch", "--no-amp", "--no-channels-last", "-b", "64", "-j", "3", "--lr", "0.2")
    resolved = resolve_defaults(args, cuda=cuda, world_size=2, local_processes=2, cpus=16)
    assert (args.amp, args.channels_last, args.batch_size, args.workers) == (False, False, 64, 3)
    assert resolved.auto == ()
    assert (resolved.lr, resolved.lr_rule) == (pytest.approx(0.2 * 128 / 256), "0.2 x 128/256")  # the global batch
    on = _args("pytorch", "--amp", "--channels-last")
    resolve_defaults(on, cuda=cuda)
    assert (on.amp, on.channels_last) == (True, True)  # also on the CPU: bfloat16 autocast, as before


def test_a_framework_with_a_fixed_layout_records_it_and_leaves_the_flag():
    args = _args("tensorflow")
    resolved = resolve_defaults(args, cuda=True, layout="NHWC", cpus=8, local_processes=1)
    assert (resolved.memory_format, args.channels_last, resolved.amp, resolved.workers) == ("NHWC", None, True, 7)
    assert "channels_last" not in resolved.auto


def test_workers_share_the_cpus_among_the_node_processes():
    assert default_workers(cuda=True, local_processes=1, cpus=16) == 15
    assert default_workers(cuda=True, local_processes=2, cpus=32) == 15
    assert default_workers(cuda=True, local_processes=8, cpus=16) == 1
    assert default_workers(cuda=True, local_processes=1, cpus=2) == 1
    assert default_workers(cuda=True, local_processes=1, cpus=256) == MAX_WORKERS
    assert default_workers(cuda=False, local_processes=1, cpus=256) == CPU_WORKERS
    assert 1 <= default_workers(cuda=True) <= MAX_WORKERS  # this machine's affinity


def test_local_process_count_from_the_launchers():
    assert local_process_count(8, env={"LOCAL_WORLD_SIZE": "4"}) == 4  # torchrun
    assert local_process_count(8, env={"OMPI_COMM_WORLD_LOCAL_SIZE": "2"}) == 2  # mpirun / horovodrun
    assert local_process_count(8, env={"HOROVOD_LOCAL_SIZE": "8"}) == 8  # horovodrun --gloo
    assert local_process_count(8, env={"SLURM_NTASKS_PER_NODE": "4"}) == 4
    assert local_process_count(8, env={}) == 8  # unknown: as if every process ran here
    assert local_process_count(1, env={}) == 1
