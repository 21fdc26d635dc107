"""The shared PyTorch training pieces (crossdali.pytorch.training), in-process and fast: loss scaling
under float16, safe checkpoint loading, atomic saves, the warm-up + cosine schedule across a resume,
accuracy counts and top-k."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from crossdali.common.distributed import DistInfo  # noqa: E402
from crossdali.common.errors import UsageError  # noqa: E402
from crossdali.common.scripts.metrics import MetricsWriter  # noqa: E402
from crossdali.pytorch.distributed import Runtime  # noqa: E402
from crossdali.pytorch.training import (  # noqa: E402
    Checkpointer,
    MixedPrecision,
    StepTracker,
    StopRequest,
    SyntheticBatches,
    TrainState,
    accuracy_counts,
    create_optimizer,
    create_scheduler,
    evaluate_classifier,
    graph_model,
    load_checkpoint,
    resolve_cuda_graphs,
)

ROOT = Path(__file__).resolve().parents[2]
CPU = Runtime(dist=DistInfo(), device=torch.device("cpu"), engine="none")


class _TinyLoss(torch.nn.Module):
    """Cross-entropy times 1e-9: float16 gradients of this size flush to zero (float16's smallest
    subnormal is 6e-8), as small gradients of a real model do under float16 autocast."""

    def forward(self, output, target):
        return torch.nn.functional.cross_entropy(output.float(), target) * 1e-9


def _video_step_setup(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 8 * 8, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    clips = [(torch.randn(2, 3, 4, 8, 8), torch.tensor([0, 3]))]
    return model, optimizer, scheduler, clips


def test_float16_gradients_survive_through_the_video_script_step(tmp_path):
    """The bug this fixes: video/train.py ran float16 autocast on CUDA and called loss.backward()
    without a GradScaler. Here float16 autocast runs on the CPU through the video script's own
    train_one_epoch: without scaling every gradient is exactly 0; with the shared step they are not."""
    from crossdali.video.train import train_one_epoch

    model, optimizer, scheduler, clips = _video_step_setup(tmp_path)
    with torch.autocast("cpu", dtype=torch.float16):  # the old loop: autocast + plain backward
        loss = _TinyLoss()(model(clips[0][0]), clips[0][1])
    loss.backward()
    assert model[1].weight.grad.abs().max() == 0  # underflowed: the old loop would never learn

    model, optimizer, scheduler, clips = _video_step_setup(tmp_path)
    before = model[1].weight.detach().clone()
    amp = MixedPrecision(enabled=True, runtime=CPU, dtype=torch.float16)
    assert amp.scaler.is_enabled()
    state = TrainState(model=model, optimizer=optimizer, scheduler=scheduler, amp=amp, loader=clips)
    tracker = StepTracker(state, runtime=CPU, checkpointer=Checkpointer(tmp_path, runtime=CPU, meta={}, metric=None),
                          metrics=MetricsWriter(None), stop=StopRequest(), epochs=1, print_freq=0)
    stats = train_one_epoch(model, _TinyLoss(), optimizer, scheduler, clips, amp=amp, tracker=tracker, runtime=CPU)
    assert stats["train_samples"] == 2
    assert model[1].weight.grad.abs().max() > 0  # unscaled float32 gradients, not flushed to zero
    assert not torch.equal(model[1].weight.detach(), before)
    assert amp.scaler.get_scale() == 65536.0  # no inf/nan seen: the scale was kept


def test_bfloat16_needs_no_scaler():
    amp = MixedPrecision(enabled=True, runtime=CPU)
    assert amp.dtype == torch.bfloat16 and not amp.scaler.is_enabled()
    assert MixedPrecision(enabled=False, runtime=CPU).dtype is None


class _Payload:
    """Unpickling this runs ``touch <marker>``: what a malicious checkpoint can do with weights_only=False."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_checkpoint_with_pickled_object_is_refused(tmp_path):
    marker, evil = tmp_path / "ran", tmp_path / "evil.pth"
    torch.save({"model": {}, "config": _Payload(marker)}, evil)
    with pytest.raises(UsageError, match=r"evil.pth holds pickled Python objects.*posix.system"):
        load_checkpoint(evil)
    assert not marker.exists()
    # and the training script turns it into one line and exit 2, before touching any data
    env = {**os.environ}
    proc = subprocess.run([sys.executable, "-m", "crossdali.pytorch.train_classification", "--data", str(tmp_path / "no"),
                           "--resume", str(evil), "--output-dir", str(tmp_path / "out")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "evil.pth holds pickled Python objects" in proc.stderr and "Traceback" not in proc.stderr
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_not_a_checkpoint_is_named(tmp_path):
    (tmp_path / "notes.pth").write_text("not a checkpoint")
    with pytest.raises(UsageError, match="notes.pth is not a readable PyTorch checkpoint"):
        load_checkpoint(tmp_path / "notes.pth")
    with pytest.raises(UsageError, match="missing.pth does not exist"):
        load_checkpoint(tmp_path / "missing.pth")
    torch.save({"weights": torch.zeros(1)}, tmp_path / "other.pth")
    with pytest.raises(UsageError, match="not a training checkpoint"):
        load_checkpoint(tmp_path / "other.pth")


def test_checkpoint_round_trip_is_plain_and_atomic(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = create_scheduler(optimizer, epochs=2, steps_per_epoch=5, warmup_epochs=0.5)
    loader = type("L", (), {"state_dict": lambda self: {"epoch": 1, "dali": b"\x00bytes"}})()
    state = TrainState(model=model, optimizer=optimizer, scheduler=scheduler,
                       amp=MixedPrecision(enabled=False, runtime=CPU), loader=loader, epoch=1, step=3, global_step=8)
    ckpt = Checkpointer(tmp_path, runtime=CPU, metric="val_top1",
                        meta={"arch": "x", "num_classes": 2, "class_names": ["a", "b"], "config": {"epochs": 2}})
    assert ckpt.improved(state, {"val_top1": 50.0}) and not ckpt.improved(state, {"val_top1": 40.0})
    ckpt.save(state, best=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_best.pth", "checkpoint_last.pth"]  # no temp left
    loaded = load_checkpoint(tmp_path / "checkpoint_last.pth")  # weights_only=True
    assert loaded["class_names"] == ["a", "b"] and loaded["config"] == {"epochs": 2}
    assert (loaded["epoch"], loaded["step"], loaded["global_step"], loaded["best"]) == (1, 3, 8, 50.0)
    assert loaded["ranks"][0]["loader"] == {"epoch": 1, "dali": b"\x00bytes"}


def test_schedule_warms_up_decays_and_continues_after_a_resume():
    def lrs(scheduler, optimizer, n):
        out = []
        for _ in range(n):
            out.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        return out

    opt = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=1.0)
    full = lrs(create_scheduler(opt, epochs=2, steps_per_epoch=10, warmup_epochs=0.5), opt, 20)
    assert full[0] == pytest.approx(0.1) and full[5] == pytest.approx(1.0)  # linear warm-up over 5 steps
    assert all(a > b for a, b in zip(full[5:], full[6:])) and full[-1] < 0.02  # cosine towards 0
    opt = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=1.0)
    sched = create_scheduler(opt, epochs=2, steps_per_epoch=10, warmup_epochs=0.5)
    first = lrs(sched, opt, 7)
    state = {"scheduler": sched.state_dict(), "optimizer": opt.state_dict()}
    opt = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=1.0)
    sched = create_scheduler(opt, epochs=2, steps_per_epoch=10, warmup_epochs=0.5)
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    assert first + lrs(sched, opt, 13) == full  # exactly the same rates


def test_accuracy_counts_and_evaluation_top_k_only_below_the_class_count():
    output = torch.tensor([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1], [0.2, 0.3, 0.5]])
    assert accuracy_counts(output, torch.tensor([1, 1, 0]), topk=(1, 2)) == [1, 2]
    model = torch.nn.Identity()
    stats = evaluate_classifier(model, torch.nn.CrossEntropyLoss(), [(output, torch.tensor([1, 0, 2]))],
                                runtime=CPU, amp=MixedPrecision(enabled=False, runtime=CPU), num_classes=3)
    assert stats["val_top1"] == 100.0 and stats["val_samples"] == 3
    assert "val_top5" not in stats  # top-5 of 3 classes would always be 100 %


def test_evaluation_sums_every_batch_weighted_by_its_size():
    """The sums stay on the device across batches (one read at the end): the loss is the mean over
    samples, not over batches, and a short last batch counts by its size."""
    torch.manual_seed(0)
    batches = [(torch.randn(n, 7), torch.randint(0, 7, (n,))) for n in (5, 5, 2)]
    stats = evaluate_classifier(torch.nn.Identity(), torch.nn.CrossEntropyLoss(), batches, runtime=CPU,
                                amp=MixedPrecision(enabled=False, runtime=CPU), num_classes=7)
    logits, labels = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    assert stats["val_samples"] == 12
    assert stats["val_loss"] == pytest.approx(float(torch.nn.functional.cross_entropy(logits, labels)))
    assert stats["val_top1"] == pytest.approx(100 * float((logits.argmax(1) == labels).float().mean()))
    assert stats["val_top5"] == pytest.approx(100 * accuracy_counts(logits, labels, topk=(5,))[0] / 12)


def test_multilabel_evaluation_equals_the_whole_set_at_once():
    """Multi-label val keeps its loss sum and scores on the device across batches: the loss is the mean
    over samples (a short last batch by its size) and mAP / F1 are those of every score at once."""
    pytest.importorskip("sklearn")
    from crossdali.common.multilabel import multilabel_metrics
    from crossdali.pytorch.training import evaluate_multilabel

    torch.manual_seed(0)
    batches = [(torch.randn(n, 4), (torch.rand(n, 4) < 0.4).float()) for n in (6, 6, 3)]
    stats = evaluate_multilabel(torch.nn.Identity(), torch.nn.BCEWithLogitsLoss(), batches, runtime=CPU,
                                amp=MixedPrecision(enabled=False, runtime=CPU))
    logits, labels = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    assert stats["val_samples"] == 15
    assert stats["val_loss"] == pytest.approx(float(torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)))
    whole = multilabel_metrics(torch.sigmoid(logits).numpy(), labels.numpy())
    assert (stats["val_map"], stats["val_f1"]) == pytest.approx((whole["map"], whole["f1"]))


def test_a_diverged_run_stops_with_one_line_naming_the_learning_rate(tmp_path):
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=5.0)
    scheduler = create_scheduler(optimizer, epochs=1, steps_per_epoch=2, warmup_epochs=0)
    state = TrainState(model=model, optimizer=optimizer, scheduler=scheduler,
                       amp=MixedPrecision(enabled=False, runtime=CPU), loader=[])
    tracker = StepTracker(state, runtime=CPU, checkpointer=Checkpointer(tmp_path, runtime=CPU, meta={}, metric=None),
                          metrics=MetricsWriter(None), stop=StopRequest(), epochs=1)
    with pytest.raises(UsageError, match=r"training loss is nan at epoch 1 \(peak learning rate 5\): lower --lr"):
        tracker.end_epoch({"train_loss": float("nan"), "train_seconds": 1.0})
    assert not (tmp_path / "checkpoint_last.pth").exists()  # a diverged state is not saved over the last good one


def test_a_step_is_recorded_a_step_late_and_read_before_every_checkpoint(tmp_path):
    """The host reads a step's loss while the next step runs (StepTracker): after step k only
    steps 1..k-1 are in metrics.jsonl, except where a checkpoint is due, which first reads every
    pending step, so the saved sums hold them all; the epoch's end reads the last ones. Records keep
    the losses, in order."""
    import json

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = create_scheduler(optimizer, epochs=1, steps_per_epoch=5, warmup_epochs=0)
    batches = SyntheticBatches((torch.randn(4, 3), torch.randint(0, 2, (4,))), sizes=[4] * 5, num_classes=2)
    state = TrainState(model=model, optimizer=optimizer, scheduler=scheduler,
                       amp=MixedPrecision(enabled=False, runtime=CPU), loader=batches)
    tracker = StepTracker(state, runtime=CPU, checkpointer=Checkpointer(tmp_path, runtime=CPU, meta={}, metric=None),
                          metrics=MetricsWriter(tmp_path), stop=StopRequest(), epochs=1, checkpoint_every=3, print_freq=0)

    def written() -> list[dict]:
        return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] \
            if (tmp_path / "metrics.jsonl").exists() else []

    losses = []
    for k, (x, y) in enumerate(tracker.steps(batches), start=1):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        losses.append(loss.item())
        state.amp.backward_step(loss, optimizer)
        scheduler.step()
        tracker.step_done(loss, x.shape[0])
        last = k if k == 3 else max(k - 1, 3 if k > 3 else 0)  # the checkpoint after step 3 read steps 1-3
        assert [r["step"] for r in written()] == list(range(1, last + 1)), k
        if k == 3:
            saved = torch.load(tmp_path / "checkpoint_last.pth", weights_only=True)
            assert saved["sums"]["samples"] == 12 and saved["sums"]["loss"] == pytest.approx(4 * sum(losses))
    records = written()
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert [r["loss"] for r in records] == pytest.approx(losses)
    assert all(r["step_s"] > 0 for r in records)
    stats = tracker.epoch_stats()
    assert stats["train_samples"] == 20 and stats["train_loss"] == pytest.approx(sum(losses) / 5)
    assert stats["train_seconds"] == pytest.approx(sum(r["step_s"] for r in records))


def test_the_optimizer_is_fused_only_on_a_cuda_gpu():
    """Fused SGD/AdamW lets GradScaler skip its per-step read of the device; on the CPU the plain
    implementation stays (the fused CPU kernels are newer and not what was measured)."""
    from crossdali.pytorch.training import create_optimizer

    for name in ("sgd", "adamw"):
        opt = create_optimizer(name, torch.nn.Linear(2, 2).parameters(), lr=0.1)
        assert not opt.defaults.get("fused"), name
    assert create_optimizer("sgd", torch.nn.Linear(2, 2).parameters(), lr=0.1, fused=False).defaults["fused"] is None


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_fused_optimizer_survives_the_steps_gradscaler_skips(name):
    """The bug this fixes: PyTorch 2.11's fused SGD left its momentum buffers uninitialised when
    GradScaler skipped the first step (float16 gradients overflow at the initial scale), and ResNet-50
    turned NaN at step 5. Here the first step overflows on purpose; afterwards the fused optimizer's
    weights equal the plain implementation's."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from crossdali.pytorch.training import create_optimizer

    weights = {}
    for fused in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).cuda()
        opt = create_optimizer(name, model.parameters(), lr=0.01, weight_decay=1e-4, fused=fused)
        assert bool(opt.defaults["fused"]) == fused
        scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 40)  # the first step's gradients overflow
        x, y = torch.randn(32, 64, device="cuda"), torch.randint(0, 8, (32,), device="cuda")
        for _ in range(4):
            with torch.autocast("cuda", dtype=torch.float16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        assert scaler.get_scale() < 2.0 ** 40  # at least one step was skipped
        weights[fused] = [p.detach().clone() for p in model.parameters()]
    assert all(torch.isfinite(w).all() for w in weights[True])
    for plain, fused in zip(weights[False], weights[True], strict=True):
        torch.testing.assert_close(fused, plain, rtol=1e-4, atol=1e-5)


def _gpu_tracker(tmp_path: Path, *, steps: int):
    """A one-process ``StepTracker`` on the GPU, with its state (a linear model, plain SGD) and ``steps``
    tiny batches: the GPU-only tracker tests below."""
    gpu = Runtime(dist=DistInfo(), device=torch.device("cuda"), engine="none")
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = create_scheduler(optimizer, epochs=1, steps_per_epoch=steps, warmup_epochs=0)
    batches = [(torch.randn(4, 3, device="cuda"), torch.randint(0, 2, (4,), device="cuda")) for _ in range(steps)]
    state = TrainState(model=model, optimizer=optimizer, scheduler=scheduler,
                       amp=MixedPrecision(enabled=False, runtime=gpu), loader=batches)
    tracker = StepTracker(state, runtime=gpu, checkpointer=Checkpointer(tmp_path, runtime=gpu, meta={}, metric=None),
                          metrics=MetricsWriter(tmp_path), stop=StopRequest(), epochs=1, print_freq=0)
    return tracker, state, batches


@pytest.mark.gpu
def test_reading_a_loss_on_the_gpu_does_not_wait_for_the_steps_queued_after_it(tmp_path):
    """The bug this fixes: the tracker read step k's loss tensor after step k+1 was launched, and that
    read copied the loss behind step k+1's kernels, so the host waited until the GPU had nothing left
    (3-4 points of synthetic speed on an H100). Here a 'step' that keeps the GPU busy for seconds
    follows step 1: recording step 1 returns while it still runs, with step 1's exact loss."""
    import json

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    tracker, state, batches = _gpu_tracker(tmp_path, steps=2)
    model, optimizer, scheduler = state.model, state.optimizer, state.scheduler
    losses = []
    for k, (x, y) in enumerate(tracker.steps(batches), start=1):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        losses.append(loss)
        state.amp.backward_step(loss, optimizer)
        scheduler.step()
        if k == 2:
            torch.cuda._sleep(5 * 10 ** 9)  # seconds of GPU time queued behind step 1
        tracker.step_done(loss, x.shape[0])
        if k == 2:  # step 1 is recorded, and the GPU is still busy with what came after it
            assert not torch.cuda.current_stream().query()
            records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
            assert [r["step"] for r in records] == [1]
            assert records[0]["loss"] == pytest.approx(losses[0].item())
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and records[1]["loss"] == pytest.approx(losses[1].item())


@pytest.mark.gpu
def test_an_epochs_last_step_ends_at_its_own_kernels_not_at_the_loaders(tmp_path):
    """The epoch's last step was timed until torch.cuda.synchronize(), which also waited for the loader's
    GPU work on its own streams (DALI decoding the next epoch's batches). Here seconds of GPU work on a
    side stream run beside the last step: the epoch ends, recorded, while that work still runs."""
    import json

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    tracker, state, batches = _gpu_tracker(tmp_path, steps=2)
    model, optimizer, scheduler = state.model, state.optimizer, state.scheduler
    torch.nn.functional.cross_entropy(model(batches[0][0]), batches[0][1]).backward()  # cuBLAS set up, not timed
    torch.cuda.synchronize()
    loader_stream = torch.cuda.Stream()
    for x, y in tracker.steps(batches):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        state.amp.backward_step(loss, optimizer)
        scheduler.step()
        with torch.cuda.stream(loader_stream):
            torch.cuda._sleep(5 * 10 ** 9)  # seconds of the 'loader's' GPU time beside the step
        tracker.step_done(loss, x.shape[0])
    assert not loader_stream.query()  # the epoch is over and recorded while the loader's work still runs
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and all(r["step_s"] < 1.0 for r in records)
    loader_stream.synchronize()


@pytest.mark.gpu
def test_a_step_record_says_how_long_the_host_then_waited_for_its_kernels(tmp_path):
    """``gpu_wait_s``, the host's lead over the GPU: step 1 queues about a second of GPU time, so the host,
    having launched step 2 at once, waits for most of it; step 2 is long done when the host, slowed down on
    purpose, launches step 3 (near 0: the GPU waited for the host); the epoch's last step, read at the
    epoch's end with no step after it, has none."""
    import json

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    tracker, state, batches = _gpu_tracker(tmp_path, steps=3)
    for k, (x, y) in enumerate(tracker.steps(batches), start=1):
        loss = torch.nn.functional.cross_entropy(state.model(x), y)
        state.amp.backward_step(loss, state.optimizer)
        state.scheduler.step()
        if k == 1:
            torch.cuda._sleep(2 * 10 ** 9)  # ~1 s of GPU time at the H100's 1.7-2 GHz
        if k == 3:
            time.sleep(0.3)  # a slow host: the GPU runs out of work
        tracker.step_done(loss, x.shape[0])
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[0]["gpu_wait_s"] > 0.5 and records[1]["gpu_wait_s"] < 0.05, records
    assert "gpu_wait_s" not in records[2]


@pytest.mark.gpu
def test_agreeing_to_stop_under_nccl_does_not_wait_for_the_gpu(tmp_path):
    """The bug this fixes: under DDP the tracker asked every rank after every step whether to stop with
    a blocking all-reduce, which waited until the GPU had run every kernel queued, so the GPU went idle
    while the host fetched and launched the next step. Here, in a one-process NCCL group: the sum the
    tracker now starts returns while seconds of GPU work are still queued, and gives the sum after it."""
    import torch.distributed as dist

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    try:
        gpu = Runtime(dist=DistInfo(), device=torch.device("cuda", 0), engine="ddp")
        assert gpu.all_reduce_sum([1.0]) == [1.0]  # NCCL up
        torch.cuda._sleep(5 * 10 ** 9)  # seconds of GPU time, queued before the question
        result = gpu.start_all_reduce_sum([1.0, 2.5], name="test")
        assert not torch.cuda.current_stream().query()  # returned with that work still running
        assert result() == [1.0, 2.5]
        assert torch.cuda.current_stream().query()  # the answer waited for the work queued before it
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("several_ranks, says", [
    (False, "SIGTERM received: finishing this step, saving a checkpoint"),
    (True, "SIGTERM received: finishing this step and the next (every rank stops after the same one), saving"),
])
def test_the_stop_announcement_says_which_step_the_job_stops_after(capfd, several_ranks, says):
    """A job of several processes agrees to stop one step late, and says so when signalled."""
    import signal

    stop = StopRequest(several_ranks=several_ranks).install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
    finally:
        stop.uninstall()
    assert stop.signum == signal.SIGTERM
    assert says in capfd.readouterr().err


def test_start_all_reduce_sum_over_gloo_and_alone(tmp_path):
    """The CPU paths of the same call: a Gloo group (the CPU scripts under torchrun) and no group."""
    import torch.distributed as dist

    assert CPU.start_all_reduce_sum([1.0, 2.0], name="test")() == [1.0, 2.0]
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        ddp = Runtime(dist=DistInfo(), device=torch.device("cpu"), engine="ddp")
        assert ddp.start_all_reduce_sum([3.0, 4.0], name="test")() == [3.0, 4.0]
    finally:
        dist.destroy_process_group()


def test_synthetic_batches_take_the_given_sizes():
    """SSD's and the video script's synthetic loader: the real loader's batch sizes, short last one too."""
    from crossdali.common.loading.epochs import LastBatchPolicy, batch_sizes

    sizes = batch_sizes(9, batch_size=4, shard_id=0, num_shards=1, policy=LastBatchPolicy.PARTIAL)
    assert sizes == [4, 4, 1]
    loader = SyntheticBatches((torch.zeros(4, 3), torch.arange(4)), sizes=sizes, num_classes=4)
    assert len(loader) == 3 and [tuple(t.shape[0] for t in b) for b in loader] == [(4, 4), (4, 4), (1, 1)]
    assert loader.epoch == 1


def test_cuda_graphs_auto_is_on_for_one_cuda_process_only():
    """--cuda-graphs auto: graphed where one process trains on a CUDA GPU; eager on the CPU and under DDP or
    Horovod (their gradient hooks cannot live in a graph), where ``on`` is refused in one line before any data
    is read (the script's line on the CPU: tests/pytorch/test_train_args.py)."""
    one_gpu = Runtime(dist=DistInfo(), device=torch.device("cuda", 0), engine="none")
    ddp = Runtime(dist=DistInfo(rank=0, world_size=2, local_rank=0), device=torch.device("cuda", 0), engine="ddp")
    assert resolve_cuda_graphs(one_gpu, "auto") and resolve_cuda_graphs(one_gpu, "on")
    assert not resolve_cuda_graphs(one_gpu, "off")
    for runtime in (CPU, ddp):
        assert not resolve_cuda_graphs(runtime, "auto") and not resolve_cuda_graphs(runtime, "off")
    with pytest.raises(UsageError, match=r"^--cuda-graphs on: one process only \(this job runs 2 under ddp, .*"
                                         r"leave --cuda-graphs out$"):
        resolve_cuda_graphs(ddp, "on")


def _bn_net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 5))


@pytest.mark.gpu
@pytest.mark.parametrize("channels_last", [False, True])
def test_a_graphed_model_trains_as_the_eager_one_does(channels_last):
    """--cuda-graphs: the same steps (AMP, loss scaling, fused SGD) on a graphed copy and on the eager model
    give the same weights and BatchNorm statistics; the capture's warm-up leaves the statistics as they were;
    a short last batch and eval mode run eagerly."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    gpu = Runtime(dist=DistInfo(), device=torch.device("cuda"), engine="none")
    torch.manual_seed(0)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    eager = _bn_net().cuda().to(memory_format=fmt)
    graphed = _bn_net().cuda().to(memory_format=fmt)
    graphed.load_state_dict(eager.state_dict())
    runs = []
    for model in (eager, graphed):
        amp = MixedPrecision(enabled=True, runtime=gpu)
        runs.append((model, create_optimizer("sgd", model.parameters(), lr=0.1, momentum=0.9), amp))
    before = [b.clone() for b in graphed.buffers()]
    graph_model(graphed, batch_shape=(6, 3, 16, 16), runtime=gpu, amp=runs[1][2], channels_last=channels_last)
    assert all(torch.equal(a, b) for a, b in zip(before, graphed.buffers()))
    batches = [(torch.randn(n, 3, 16, 16, device="cuda"), torch.randint(0, 5, (n,), device="cuda"))
               for n in (6, 6, 6, 4, 6)]  # the 4: an epoch's short last batch, then the next epoch
    for x, y in batches:
        for model, optimizer, amp in runs:
            model.train()
            with amp.autocast():
                loss = torch.nn.functional.cross_entropy(model(x.contiguous(memory_format=fmt)), y)
            amp.backward_step(loss, optimizer)
    for a, b in zip(eager.state_dict().values(), graphed.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-2, atol=1e-3)
    assert graphed.state_dict()["1.num_batches_tracked"].item() == len(batches)
    assert runs[1][2].scaler.get_scale() == runs[0][2].scaler.get_scale()
    eager.eval()
    graphed.eval()
    with torch.no_grad():
        torch.testing.assert_close(graphed(batches[0][0]), eager(batches[0][0]), rtol=1e-2, atol=1e-3)


_UNCAPTURABLE = """
import torch
from crossdali.common.distributed import DistInfo
from crossdali.pytorch.distributed import Runtime
from crossdali.pytorch.training import MixedPrecision, graph_model

class SyncingNet(torch.nn.Module):  # reads a value back to the host in its forward: a graph cannot hold that
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return self.conv(x) * (1.0 if x.mean().item() > -1e9 else 0.0)

gpu = Runtime(dist=DistInfo(), device=torch.device("cuda"), engine="none")
graph_model(SyncingNet().cuda(), batch_shape=(2, 3, 8, 8), runtime=gpu, amp=MixedPrecision(enabled=True, runtime=gpu))
"""


@pytest.mark.gpu
def test_a_model_that_cannot_be_captured_is_a_usage_error_naming_the_fix():
    """A failed capture leaves CUDA's random generator unusable in the process, so the run cannot go on
    eagerly: it stops with the reason and ``--cuda-graphs off`` (a UsageError: one line, exit 2, in a script).
    In a subprocess, so that the broken generator does not reach the other tests."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    proc = subprocess.run([sys.executable, "-c", _UNCAPTURABLE], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("crossdali.common.errors.UsageError: --cuda-graphs: SyncingNet cannot be captured as a "
                           "CUDA graph (") and last.endswith("); rerun with --cuda-graphs off"), proc.stderr[-3000:]
