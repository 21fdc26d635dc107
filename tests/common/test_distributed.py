"""Launcher detection from the environment variables each launcher really sets.

The variable sets below are what the launchers export for the second of two processes (torchrun
2.x, horovodrun 0.28 with Gloo and over mpirun, Open MPI 4/5, MPICH/Intel MPI Hydra, Slurm srun).
tests/launch starts real torchrun and horovodrun jobs; mpirun, mpiexec and srun are not installed on
CI, so their variables are set here. Each test starts from an environment with no launcher variable.
"""

from __future__ import annotations

import pytest

from crossdali.common.distributed import LAUNCHER_VARIABLES, DistInfo, cuda_visible_count, detect_distributed, local_gpu
from crossdali.common.errors import UsageError

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "none"}
HOROVOD_GLOO = {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2",
                "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
                "HOROVOD_GLOO_RENDEZVOUS_PORT": "41235", "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo"}
OPEN_MPI = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": "0", "PMIX_RANK": "1"}
# horovodrun without --gloo runs mpirun: Open MPI's variables plus Horovod's own settings, no HOROVOD_RANK.
HOROVOD_MPI = {**OPEN_MPI, "HOROVOD_CONTROLLER": "mpi", "HOROVOD_CPU_OPERATIONS": "mpi"}
MPICH = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "PMI_FD": "6"}
SLURM = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_NODEID": "0", "SLURM_NNODES": "1",
         "SLURM_JOB_ID": "4242", "SLURM_NPROCS": "2"}
# Two nodes, second process of the second node: the global rank differs from the local one.
SLURM_TWO_NODES = {**SLURM, "SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "1"}

ALL_VARIABLES = {name for names in LAUNCHER_VARIABLES.values() for name in names} | {
    *TORCHRUN, *HOROVOD_GLOO, *HOROVOD_MPI, *MPICH, *SLURM}


@pytest.fixture
def launcher_env(monkeypatch):
    """Clear every launcher variable from ``os.environ``, then set the given ones."""
    for name in ALL_VARIABLES:
        monkeypatch.delenv(name, raising=False)

    def set_env(variables: dict[str, str]) -> None:
        for name, value in variables.items():
            monkeypatch.setenv(name, value)

    return set_env


@pytest.mark.parametrize("variables, expected", [
    (TORCHRUN, DistInfo(rank=1, world_size=2, local_rank=1, launcher="torchrun")),
    (HOROVOD_GLOO, DistInfo(rank=1, world_size=2, local_rank=1, launcher="horovodrun")),
    (HOROVOD_MPI, DistInfo(rank=1, world_size=2, local_rank=1, launcher="openmpi")),
    (OPEN_MPI, DistInfo(rank=1, world_size=2, local_rank=1, launcher="openmpi")),
    (MPICH, DistInfo(rank=1, world_size=2, local_rank=1, launcher="mpich")),
    (SLURM, DistInfo(rank=1, world_size=2, local_rank=1, launcher="slurm")),
    (SLURM_TWO_NODES, DistInfo(rank=3, world_size=4, local_rank=1, launcher="slurm")),
], ids=["torchrun", "horovodrun-gloo", "horovodrun-mpi", "openmpi", "mpich", "slurm", "slurm-two-nodes"])
def test_detects_each_launcher(launcher_env, variables, expected):
    launcher_env(variables)
    info = detect_distributed()
    assert info == expected
    assert info.is_distributed and not info.is_main


def test_plain_python_is_one_process(launcher_env):
    launcher_env({})
    info = detect_distributed()
    assert info == DistInfo(rank=0, world_size=1, local_rank=0, launcher="none")
    assert info.is_main and not info.is_distributed


@pytest.mark.parametrize("outer, inner, launcher", [
    (SLURM, TORCHRUN, "torchrun"),       # torchrun inside an srun allocation: torchrun's ranks count
    (SLURM, OPEN_MPI, "openmpi"),        # mpirun (or horovodrun over MPI) inside Slurm
    (SLURM, HOROVOD_GLOO, "horovodrun"),
])
def test_innermost_launcher_wins_inside_slurm(launcher_env, outer, inner, launcher):
    """Slurm's variables stay set for whatever the job script launches; the launcher that really
    started this process is the one whose ranks count."""
    launcher_env({**outer, "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0"})
    launcher_env(inner)
    assert detect_distributed() == DistInfo(rank=1, world_size=2, local_rank=1, launcher=launcher)


def test_sbatch_script_without_srun_is_one_process(launcher_env):
    """An sbatch script (no srun) has SLURM_PROCID=0 but may lack SLURM_NTASKS: one process."""
    launcher_env({"SLURM_PROCID": "0", "SLURM_JOB_ID": "4242"})
    assert detect_distributed() == DistInfo()


def test_missing_local_rank_defaults_to_zero(launcher_env):
    launcher_env({"PMI_RANK": "1", "PMI_SIZE": "2"})  # MPICH without Hydra's MPI_LOCALRANKID
    assert detect_distributed() == DistInfo(rank=1, world_size=2, local_rank=0, launcher="mpich")


def test_explicit_mapping_ignores_os_environ(launcher_env):
    launcher_env(TORCHRUN)
    assert detect_distributed(SLURM_TWO_NODES) == DistInfo(rank=3, world_size=4, local_rank=1, launcher="slurm")


@pytest.mark.parametrize("variables, message", [
    ({**TORCHRUN, "RANK": "2"}, r"torchrun: RANK=2 is not in \[0, WORLD_SIZE=2\)"),
    ({**HOROVOD_GLOO, "HOROVOD_RANK": "-1"}, r"horovodrun: HOROVOD_RANK=-1 is not in \[0, HOROVOD_SIZE=2\)"),
    ({**OPEN_MPI, "OMPI_COMM_WORLD_SIZE": "0"}, r"openmpi: OMPI_COMM_WORLD_RANK=1 is not in \[0, OMPI_COMM_WORLD_SIZE=0\)"),
    ({**SLURM, "SLURM_NTASKS": "two"}, r"SLURM_NTASKS='two' \(set by slurm\) is not an integer"),
    ({**MPICH, "MPI_LOCALRANKID": "-3"}, r"mpich: MPI_LOCALRANKID=-3 must not be negative"),
    ({**TORCHRUN, "LOCAL_RANK": "2"}, r"torchrun: LOCAL_RANK=2 is not in \[0, WORLD_SIZE=2\)"),
    ({"RANK": "1", "MASTER_ADDR": "127.0.0.1"}, r"RANK=1 is set but WORLD_SIZE is not"),
    ({"HOROVOD_RANK": "3"}, r"HOROVOD_RANK=3 is set but HOROVOD_SIZE is not"),
], ids=["rank-too-large", "negative-rank", "zero-world-size", "not-an-integer", "negative-local-rank",
        "local-rank-too-large", "rank-without-world-size", "horovod-rank-without-size"])
def test_inconsistent_values_fail_with_the_variable_named(launcher_env, variables, message):
    launcher_env(variables)
    with pytest.raises(ValueError, match=message):
        detect_distributed()


# -- which GPU a rank uses: all of its node's GPUs visible, or the one a launcher bound it to -------------

@pytest.mark.parametrize("local_rank", [0, 1, 3, 7])
def test_one_visible_gpu_is_gpu_0_for_any_local_rank(local_rank):
    assert local_gpu(local_rank, 1) == 0  # srun --gpus-per-task=1: GPU <local rank> does not exist here


@pytest.mark.parametrize("local_rank", [0, 1, 3])
def test_every_gpu_visible_is_the_local_ranks(local_rank):
    assert local_gpu(local_rank, 4) == local_rank


def test_too_few_visible_gpus_names_the_local_rank_and_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    with pytest.raises(UsageError, match=r"local rank 3 .* sees 2 GPUs \(CUDA_VISIBLE_DEVICES='2,3'\).*"
                                         r"--gpus-per-task=1"):
        local_gpu(3, 2)


@pytest.mark.parametrize("value, count", [(None, None), ("", 0), ("1", 1), ("0,1,2,3", 4),
                                          ("GPU-8f1c2d3e-aaaa-bbbb-cccc-000000000000,1", 2)])
def test_cuda_visible_count(value, count):
    assert cuda_visible_count({} if value is None else {"CUDA_VISIBLE_DEVICES": value}) == count


def test_gpu_id_default_follows_cuda_visible_devices_and_keeps_an_explicit_device_id(monkeypatch):
    rank = DistInfo(rank=3, world_size=4, local_rank=1, launcher="slurm")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert rank.gpu_id() == 1  # no CUDA_VISIBLE_DEVICES: every GPU of the node, the local rank's
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert rank.gpu_id() == 0  # bound by the launcher
    assert rank.gpu_id(visible_gpus=8) == 1  # the framework's count wins
    assert rank.gpu_id(5) == 5  # a device_id given is used as given
