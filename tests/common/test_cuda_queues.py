"""CUDA's hardware queues for a process where DALI shares the GPU (crossdali.common.loading.cuda_queues)."""

from __future__ import annotations

from crossdali.common.loading import cuda_queues


def _unset(monkeypatch) -> None:
    """Unset for the test, and unset again (or as it was) after it, whatever the code under test set."""
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "8")  # records the value before the test
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS")


def test_unset_becomes_32_and_a_users_value_wins(monkeypatch):
    _unset(monkeypatch)
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=32" in cuda_queues.queues_hint()
    assert cuda_queues.share_gpu_with_dali() == "32"
    assert cuda_queues.queues_hint() is None  # set: nothing to say
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # e.g. a library that orders its streams this way
    assert cuda_queues.share_gpu_with_dali() == "1"
    assert cuda_queues.queues_hint() is None


def test_a_queue_count_cuda_cannot_give_is_refused(monkeypatch):
    import pytest

    _unset(monkeypatch)
    with pytest.raises(ValueError, match="1 to 32 hardware queues, not 33"):
        cuda_queues.share_gpu_with_dali(33)
    assert cuda_queues.share_gpu_with_dali(8) == "8"


def test_the_pytorch_training_session_sets_them_before_cuda(monkeypatch):
    """Every PyTorch training script enters training_session first; it sets the variable before the
    process group (and with it CUDA) starts."""
    import pytest

    pytest.importorskip("torch")
    from crossdali.pytorch.training import training_session

    _unset(monkeypatch)
    with training_session(engine="none") as (runtime, _):
        import os

        assert os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
        assert runtime.dist.world_size == 1
