"""One command line, every framework's classification script (issue: "the same flag set for every
framework's classification script, as the README claims"): each parser present in this environment
takes the same argv and gives the same values, and all of them have the same options."""

from __future__ import annotations

import importlib

import pytest

SCRIPTS = {
    "pytorch": ("torch", "crossdali.pytorch.train_classification", "resnet18"),
    "tensorflow": ("tensorflow", "crossdali.tensorflow.train_classification", "resnet50"),
    "mxnet": ("mxnet", "crossdali.mxnet.train_classification", "resnet18"),
    "jax": ("jax", "crossdali.jax.train_classification", "resnet18"),
}
#: The options of the PyTorch classification script, which every classification script must have.
SHARED = ["--data", "--data-format", "--sample-size", "--data-backend", "-j", "--workers", "--crop-size",
          "--hw-decoder-load", "--exclude", "--skip-check", "--arch", "--num-classes", "-b", "--batch-size", "--epochs",
          "--lr", "--lr-warmup-epochs", "--momentum", "--wd", "--weight-decay", "--label-smoothing", "--engine", "--amp",
          "--no-amp", "--channels-last", "--no-channels-last", "--resume", "--test-only", "--output-dir",
          "--checkpoint-every", "--seed", "--print-freq",
          "--debug", "--multi-label", "--auto-augment", "-h", "--help"]
#: Flags one framework has and the others do not yet, each named here so a new one is a decision:
#: --pipelines (the shard split over several DALI pipelines) is PyTorch's only: its loader merges them, and
#: TensorFlow's DALIDataset, MXNet's and the JAX script's loaders run one pipeline per process;
#: --jit-compile (XLA for the train step) is TensorFlow's only: the JAX script always compiles its step with
#: XLA, and PyTorch's and MXNet's have no XLA; --fetch-ahead (a thread fetching the batches) is TensorFlow's
#: only: DALIDataset's next() waits for TensorFlow's compute stream, where DALI's PyTorch, MXNet and JAX
#: iterators hand over batches without waiting for the running step (--handover dlpack takes DALI's batches
#: without DALIDataset, as those iterators do; --read-loss-every answers TensorFlow's copy of the loss waiting
#: for its whole stream); --cuda-graphs is PyTorch's only: XLA
#: (TensorFlow's --jit-compile, JAX) and MXNet's symbolic graphs launch a step their own way
ONLY_IN: dict[str, set[str]] = {"pytorch": {"--pipelines", "--cuda-graphs", "--global-order"},
                                "tensorflow": {"--jit-compile", "--fetch-ahead", "--read-loss-every",
                                               "--handover"}}


def _parser(framework: str):
    module_name, script, arch = SCRIPTS[framework]
    pytest.importorskip(module_name)
    return importlib.import_module(script).get_args_parser(), arch


@pytest.mark.parametrize("framework", SCRIPTS)
def test_every_classification_script_has_the_shared_options(framework):
    parser, _ = _parser(framework)
    options = {o for action in parser._actions for o in action.option_strings}
    assert sorted(set(SHARED) - options) == [], f"{framework} lacks shared flags"
    assert sorted(options - set(SHARED)) == sorted(ONLY_IN.get(framework, ())), f"{framework} has flags the others lack"


@pytest.mark.parametrize("framework", SCRIPTS)
def test_the_same_command_line_parses_to_the_same_values(framework, tmp_path):
    parser, arch = _parser(framework)
    argv = ["--data", str(tmp_path), "--data-backend", "dali-cpu", "--arch", arch, "-b", "16", "--epochs", "2",
            "--lr", "0.05", "--crop-size", "64", "-j", "2", "--amp", "--channels-last", "--seed", "3",
            "--output-dir", str(tmp_path / "run"), "--checkpoint-every", "5", "--exclude", str(tmp_path / "x.txt"),
            "--skip-check", "--debug", "--resume", str(tmp_path / "ckpt"), "--test-only", "--print-freq", "7",
            "--hw-decoder-load", "0.5", "--label-smoothing", "0.1", "--wd", "5e-5"]
    args = parser.parse_args(argv)
    assert (args.data, args.data_backend, args.arch, args.batch_size, args.epochs, args.lr, args.crop_size,
            args.workers, args.amp, args.channels_last, args.seed) == \
        (tmp_path, "dali-cpu", arch, 16, 2, 0.05, 64, 2, True, True, 3)
    assert (args.output_dir, args.checkpoint_every, args.exclude, args.skip_check, args.debug, args.resume,
            args.test_only, args.print_freq, args.hw_decoder_load, args.label_smoothing, args.weight_decay) == \
        (tmp_path / "run", 5, tmp_path / "x.txt", True, True, tmp_path / "ckpt", True, 7, 0.5, 0.1, 5e-5)


@pytest.mark.parametrize("framework", SCRIPTS)
def test_the_machine_dependent_defaults_and_their_off_switches(framework):
    """--amp, --channels-last, -b and -j are left to ``resolve_defaults`` (None) in every script, and
    --no-amp/--no-channels-last turn the GPU defaults off the same way everywhere."""
    parser, _ = _parser(framework)
    args = parser.parse_args([])
    assert (args.amp, args.channels_last, args.batch_size, args.workers) == (None, None, None, None)
    args = parser.parse_args(["--no-amp", "--no-channels-last"])
    assert (args.amp, args.channels_last) == (False, False)


@pytest.mark.parametrize("framework", SCRIPTS)
def test_a_bad_value_is_one_line_and_exit_2(framework, capsys):
    parser, _ = _parser(framework)
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--epochs", "0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--epochs" in err, err


def _gpu_visible(framework: str) -> bool:
    if framework == "pytorch":
        import torch
        return torch.cuda.is_available()
    if framework == "tensorflow":
        import tensorflow as tf
        return bool(tf.config.list_physical_devices("GPU"))
    if framework == "mxnet":
        import mxnet as mx
        return mx.context.num_gpus() > 0
    import jax
    return jax.default_backend() == "gpu"


@pytest.mark.parametrize("framework", SCRIPTS)
def test_dali_gpu_without_a_gpu_is_one_line_before_any_data_is_read(framework, tmp_path, capsys):
    """The same early refusal in every framework, with that framework's own fix in the line."""
    parser, arch = _parser(framework)
    if _gpu_visible(framework):
        pytest.skip("a GPU is visible here")
    from crossdali.common.scripts.script import run
    script = importlib.import_module(SCRIPTS[framework][1])
    missing = tmp_path / "no-such-folder"  # would be refused later, if the backend were not refused first
    with pytest.raises(SystemExit) as exit_info:
        run(script.main, parser, ["--data", str(missing), "--data-backend", "dali-gpu", "--arch", arch,
                                  "--output-dir", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--data-backend dali-gpu needs" in err[0] and "dali-cpu" in err[0], err
    assert not (tmp_path / "run").exists()
