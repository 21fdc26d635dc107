"""The Keras classification script with the settings left to the machine (no --amp, -b, -j): on the
CPU it trains in float32 with today's batch and threads, and records what it resolved them to."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("nvidia.dali.plugin.tf")

from crossdali.tensorflow.train_classification import get_args_parser, main  # noqa: E402

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]


def test_a_cpu_run_with_the_defaults_trains_and_records_them(data_root, tiny_classification, tmp_path, monkeypatch,
                                                             assert_finished_run):
    if tf.config.list_physical_devices("GPU"):
        pytest.skip("the defaults checked here are the CPU's")
    monkeypatch.setenv("CROSSDALI_DATA", str(data_root))
    args = get_args_parser().parse_args(["--sample-size", "tiny", "--arch", "small_cnn", "--crop-size", "32",
                                         "--epochs", "1", "--print-freq", "0", "--output-dir", str(tmp_path)])
    stats = main(args)
    assert stats["train_samples"] == 264 and stats["val_samples"] == 55
    assert tf.keras.mixed_precision.global_policy().name == "float32"
    start = assert_finished_run(tmp_path, epochs=1, framework="tensorflow")[0]
    assert (start["amp"], start["memory_format"], start["batch_size"], start["workers"], start["cuda"]) == \
        (False, "NHWC", 128, 4, False)
    assert (start["lr"], start["lr_rule"], start["auto_defaults"]) == (0.05, "0.1 x 128/256",
                                                                       ["amp", "batch_size", "workers"])
