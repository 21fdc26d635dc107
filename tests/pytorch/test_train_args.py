"""One command line, parsed by every training script: the shared flags (crossdali.common.scripts.train_args)
mean the same everywhere. Also: --help shows the defaults, a wrong --arch is refused with the
choices before any data is read, and user errors are one line with exit 2 (--debug: a traceback)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Script module -> the framework it needs (the TensorFlow and MXNet scripts skip where it is absent).
SCRIPTS = {
    "crossdali.pytorch.train_classification": "torch",
    "crossdali.detection_ssd.train": "torch",
    "crossdali.video.train": "torch",
    "crossdali.tensorflow.train_classification": "tensorflow",
    "crossdali.mxnet.train_classification": "mxnet",
}
PYTORCH_SCRIPTS = [m for m, f in SCRIPTS.items() if f == "torch"]
#: Flags every script of every framework takes, and what they parse to.
EVERYWHERE = (["--data", "/data/x", "--sample-size", "tiny", "-b", "4", "--epochs", "3", "--lr", "0.01",
               "--lr-warmup-epochs", "0.5", "--momentum", "0.8", "--wd", "0.001", "-j", "3", "--resume", "r.pth",
               "--test-only", "--output-dir", "o", "--seed", "5", "--print-freq", "7"],
              {"data": Path("/data/x"), "sample_size": "tiny", "batch_size": 4, "epochs": 3, "lr": 0.01,
               "lr_warmup_epochs": 0.5, "momentum": 0.8, "weight_decay": 0.001, "workers": 3, "resume": Path("r.pth"),
               "test_only": True, "output_dir": Path("o"), "seed": 5, "print_freq": 7})
#: Flags every PyTorch script (classification, SSD, video) takes on top.
PYTORCH = (["--amp", "--checkpoint-every", "20", "--debug", "--engine", "none", "--data-backend", "synthetic"],
           {"amp": True, "checkpoint_every": 20, "debug": True, "engine": "none", "data_backend": "synthetic"})


def _parser(module: str):
    pytest.importorskip(SCRIPTS[module])
    return importlib.import_module(module).get_args_parser()


@pytest.mark.parametrize("module", list(SCRIPTS))
def test_the_same_command_line_means_the_same_everywhere(module):
    parser = _parser(module)
    argv, expected = EVERYWHERE
    if SCRIPTS[module] == "torch":
        argv, expected = argv + PYTORCH[0], expected | PYTORCH[1]
    args = vars(parser.parse_args(argv))
    assert {k: args[k] for k in expected} == expected


@pytest.mark.parametrize("module", PYTORCH_SCRIPTS)
def test_help_shows_defaults_and_arch_choices(module):
    text = " ".join(_parser(module).format_help().split())
    assert "--epochs EPOCHS epochs to train (in total, also when resuming) (default:" in text
    assert "--checkpoint-every CHECKPOINT_EVERY" in text and "(default: 1000)" in text
    names = "`crossdali models` lists them" if module.endswith("train_classification") else "one of"
    assert "--arch ARCH" in text and names in text
    assert "--data-backend {auto," in text and "synthetic}" in text


@pytest.mark.parametrize("module, good", [("crossdali.pytorch.train_classification", "resnet50"),
                                          ("crossdali.detection_ssd.train", "resnet34"),
                                          ("crossdali.video.train", "r2plus1d_18")])
def test_unknown_arch_is_refused_with_the_choices(module, good, capsys):
    with pytest.raises(SystemExit) as e:
        _parser(module).parse_args(["--arch", "resnet5", "--data", "/nonexistent"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    refusal = "unknown model 'resnet5' (closest: " if module.endswith("train_classification") else "invalid choice: 'resnet5'"
    assert len(err) == 1 and f"argument --arch: {refusal}" in err[0] and good in err[0]


def _run(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ}
    return subprocess.run([sys.executable, "-m", "crossdali.pytorch.train_classification", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_user_errors_are_one_line_and_exit_2(tmp_path):
    pytest.importorskip("torch")
    proc = _run("--data", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("train_classification.py: error: ")
    assert str(tmp_path / "nowhere") in last and "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()
    # --debug: the same error with its traceback
    proc = _run("--data", str(tmp_path / "nowhere"), "--debug", cwd=tmp_path)
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "DataError" in proc.stderr
    # a bad flag value: argparse's error, one line, exit 2
    proc = _run("-b", "0", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "train_classification.py: error: argument -b/--batch-size: must be a positive integer, got 0 (see --help)"]


@pytest.mark.slow
def test_pipelines_needs_a_dali_backend_and_a_batch_it_divides(tmp_path, data_root, tiny_classification):
    """--pipelines: refused in one line, exit 2, where it cannot apply (a backend without DALI
    pipelines, a batch size it does not divide), before any training."""
    pytest.importorskip("torch")
    env = {**os.environ, "CROSSDALI_DATA": str(data_root)}
    base = [sys.executable, "-m", "crossdali.pytorch.train_classification", "--sample-size", "tiny", "--epochs", "1",
            "--output-dir", str(tmp_path / "run")]
    for argv, words in [(["--data-backend", "native", "--pipelines", "2"],
                         ["pipelines=2 (--pipelines)", "'native' backend (--data-backend) has none"]),
                        (["--data-backend", "dali-cpu", "-b", "32", "--pipelines", "3"],
                         ["pipelines=3 (--pipelines)", "batch size 32 (--batch-size)"])]:
        proc = subprocess.run([*base, *argv], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        last = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert all(w in last for w in words), last
        assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flag, message", [
    (["--cuda-graphs", "on"], "--cuda-graphs on: the model runs on the cpu here, and CUDA graphs are CUDA's; leave "
                              "--cuda-graphs out"),
], ids=["cuda-graphs"])
def test_cuda_only_flags_need_a_cuda_gpu(tmp_path, flag, message):
    """--cuda-graphs on, on a machine without CUDA: one line naming the flag and the fix,
    exit 2, before any data is read or any run folder made (on the GPU the script trains with them: README;
    the graphs' GPU tests: tests/pytorch/test_training.py, -m gpu)."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: the flag applies")
    proc = _run("--data", str(tmp_path / "nowhere"), *flag, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == f"train_classification.py: error: {message}"
    assert not (tmp_path / "runs").exists()
