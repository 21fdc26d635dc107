"""Every training script's full command line, defined without importing a framework, so that
``crossdali train TASK --help`` answers at once and a wrong flag or ``--data`` path is refused
before PyTorch, TensorFlow, JAX or MXNet spend seconds loading (issue: "``--help`` under 1 s with
lazy imports; argument and data errors before heavy imports").

Each script's ``get_args_parser`` returns its parser from here; ``PARSERS`` maps ``(task,
framework)`` to it for ``crossdali train``. ``--arch`` is checked against the names in
``crossdali.common.models`` (the classifiers' table of every framework, the video models), without
importing any framework.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from crossdali.common.data.sample_data import SIZES
from crossdali.common.data.sample_data.video import VIDEO_SIZES
from crossdali.common.distributed import ENGINES
from crossdali.common.models import VIDEO_MODELS, models_for
from crossdali.common.options import CLASSIFICATION_BACKENDS, DALI_BACKENDS
from crossdali.common.scripts.train_args import (
    add_classification_data_args,
    add_data_args,
    add_model_args,
    add_optimizer_args,
    add_run_args,
    create_parser,
    non_negative_int,
    positive_int,
)
from crossdali.common.video import CPU_TRAIN_BATCH, DEFAULT_CLIPS_PER_READ, GPU_TRAIN_BATCH, GPU_TRAIN_PIPELINES

__all__ = ["PARSERS", "JAX_CHECKPOINT", "pytorch_classification", "tensorflow_classification", "jax_classification",
           "mxnet_classification", "ssd_detection", "video_classification"]

#: the JAX script's checkpoint file (its flags name it)
JAX_CHECKPOINT = "checkpoint.msgpack"
_TORCH_ENGINE_HELP = "gradient averaging; auto: horovod under horovodrun, DDP under torchrun/Slurm"
_TORCH_RESUME_HELP = "checkpoint_last.pth (or checkpoint_best.pth) to continue from, or to evaluate with --test-only"


def _ssd_backbones() -> list[str]:
    """torchvision ResNets the SSD300 backbone accepts (up to layer3, stride 1 in layer3)."""
    return [m for m in models_for("pytorch") if m.startswith(("resnet", "resnext", "wide_resnet")) and "_v2" not in m]


def add_multi_label_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--multi-label", action="store_true",
                        help="several labels per image from list files (--data holding train.txt and val.txt: "
                             "'<image> <label> <label> ...' per line; default: the multi-label sample set): "
                             "sigmoid + binary cross-entropy, val mAP and macro F1; DALI backends only")


def pytorch_classification(add_help: bool = True) -> argparse.ArgumentParser:
    parser = create_parser("crossdali PyTorch classification training", add_help=add_help)
    add_classification_data_args(
        parser, backends=CLASSIFICATION_BACKENDS, arch="resnet50", framework="pytorch",
        arch_help="classifier (torchvision's models, and small_cnn for tests)",
        workers_help="DALI threads or DataLoader workers per process")
    parser.add_argument("--pipelines", type=positive_int, default=1,
                        help="DALI pipelines per process, each decoding its own part of the shard (batch-size / "
                             "pipelines images each per step; the batch size must divide by it; DALI backends, not "
                             "--multi-label). 2 load faster where the loader is the bottleneck, but leave the model "
                             "less of the GPU (docs/benchmarks.md#classification-loaders). --resume needs the count "
                             "the checkpoint was saved with")
    parser.add_argument("--global-order", action="store_true",
                        help="train in one order of the whole dataset per epoch that depends on --seed and the epoch "
                             "only, not on the number of processes, so a mid-epoch checkpoint resumes on any number "
                             "(DALI backends, image files, one pipeline; docs/distributed.md#resuming-on-a-different-"
                             "number-of-gpus). Default: DALI's sharded order, which resumes on the same number only")
    parser.add_argument("--cuda-graphs", choices=("auto", "on", "off"), default="auto",
                        help="capture the model's training forward and backward as CUDA graphs, so that the host "
                             "launches a step in a few calls. auto: on where one process trains on a CUDA GPU "
                             "(docs/benchmarks.md#training-speed). "
                             "An epoch's short last batch runs eagerly, beside the graphs' memory: off where a run "
                             "only just fits, or for a model that cannot be captured (the run says so)")
    add_run_args(parser, engines=ENGINES["pytorch"], amp=True, amp_default=None, channels_last=True,
                 channels_last_default=None, checkpoint_every=True, run_dir=True, debug=True,
                 engine_help=_TORCH_ENGINE_HELP, resume_help=_TORCH_RESUME_HELP)
    add_multi_label_arg(parser)
    return parser


def tensorflow_classification(add_help: bool = True) -> argparse.ArgumentParser:
    parser = create_parser("crossdali TensorFlow/Keras classification training", add_help=add_help)
    add_classification_data_args(parser, backends=CLASSIFICATION_BACKENDS, arch="resnet50", framework="tensorflow",
                                 arch_help="classifier (tf.keras.applications models, and small_cnn for tests)",
                                 workers_help="DALI threads or tf.data parallel calls per process")
    add_run_args(parser, engines=ENGINES["tensorflow"], amp=True, amp_default=None, channels_last_default=None,
                 amp_help="mixed precision: mixed_float16 on GPU, mixed_bfloat16 on CPU",
                 channels_last=True, channels_last_help="accepted for the PyTorch script's command lines: Keras models "
                                                        "here are NHWC (channels_last) already",
                 checkpoint_every=True, checkpoint_every_default=0,
                 checkpoint_every_help="accepted for the PyTorch script's command lines; the TensorFlow script saves "
                                       "at epoch ends only (DALIDataset cannot restore a mid-epoch DALI position)",
                 debug=True, run_dir=True,
                 engine_help="gradient averaging; auto: horovod when a launcher started several processes, "
                             "tf-distribute (MultiWorkerMirroredStrategy) when TF_CONFIG is set",
                 resume_help="checkpoint (prefix or folder) to resume from")
    parser.add_argument("--jit-compile", choices=("auto", "on", "off"), default="auto",
                        help="compile the train step with XLA. auto: on where TensorFlow sees a GPU and one process "
                             "trains (Keras' own rule for model.fit); on: also on the CPU, and under Horovod or "
                             "tf.distribute, where the gradients are compiled and their averaging and the optimizer are "
                             "not (their collectives are not XLA ops)")
    parser.add_argument("--fetch-ahead", type=non_negative_int, default=1, metavar="N",
                        help="batches a background thread fetches ahead of the train step (0: the loop fetches each "
                             "batch after reading the last step's loss). DALIDataset's next() waits for the step "
                             "queued on TensorFlow's stream; from the thread it waits beside it "
                             "(docs/benchmarks.md#training-speed)")
    parser.add_argument("--read-loss-every", type=positive_int, default=8, metavar="N",
                        help="read the step losses in blocks of N steps, the newest step still queued (1: each loss "
                             "once the next step is launched). TensorFlow's copy of the loss to the host waits for "
                             "everything queued on its compute stream, so each read leaves the GPU idle while the host "
                             "launches the next step: N spreads that over N steps (docs/tensorflow.md)")
    parser.add_argument("--handover", choices=("auto", "dlpack", "dataset"), default="auto",
                        help="how the loop takes DALI's batches: dlpack (DALI's buffers shared without a copy, kept "
                             "alive until the steps that read them are done), dataset (DALIDataset: a copy on "
                             "TensorFlow's stream that waits for the steps queued there), auto: dlpack where TensorFlow "
                             "numbers the GPU as CUDA does (one GPU visible per process), else dataset "
                             "(docs/tensorflow.md#the-hand-over)")
    add_multi_label_arg(parser)
    return parser


def jax_classification(add_help: bool = True) -> argparse.ArgumentParser:
    parser = create_parser("crossdali JAX/flax classification training", add_help=add_help)
    add_classification_data_args(parser, backends=(*DALI_BACKENDS, "synthetic"), arch="resnet50", framework="jax",
                                 arch_help="flax classifier (crossdali.jax.models; small_cnn for tests)",
                                 workers_help="DALI threads")
    add_run_args(parser, engines=ENGINES["jax"], amp=True, amp_default=None, channels_last_default=None,
                 amp_help="compute in bfloat16 (weights and loss stay float32)",
                 engine_help="data-parallel over every device JAX sees, jax.distributed under a launcher (docs/jax.md): "
                             "auto and none are the same",
                 channels_last=True, channels_last_help="accepted for the PyTorch script's command lines: the flax "
                                                        "models here are NHWC already",
                 checkpoint_every=True, checkpoint_every_default=0,
                 checkpoint_every_help=f"accepted for the PyTorch script's command lines; the JAX script saves "
                                       f"{JAX_CHECKPOINT} at epoch ends only",
                 debug=True, run_dir=True, resume_help=f"{JAX_CHECKPOINT} (or its folder) to resume from")
    add_multi_label_arg(parser)
    for action in parser._actions:  # one JAX process may drive several GPUs: -b is each one's share
        if action.dest == "batch_size":
            action.help = action.help.replace("samples per process per step", "samples per device per step (the step's "
                                              "batch is this x every device of the job)")
    return parser


def mxnet_classification(add_help: bool = True) -> argparse.ArgumentParser:
    parser = create_parser("crossdali MXNet (Gluon) classification training", add_help=add_help)
    add_classification_data_args(parser, backends=CLASSIFICATION_BACKENDS, arch="resnet50", framework="mxnet",
                                 arch_help="classifier (Gluon model zoo; its own names such as resnet50_v1 work too)",
                                 workers_help="DALI threads or ImageRecordIter threads per process",
                                 backend_help="native = mx.io.ImageRecordIter (needs RecordIO)")
    add_run_args(parser, engines=ENGINES["mxnet"], amp=True, amp_default=None, channels_last_default=None,
                 amp_help="mixed precision: MXNet's AMP (mxnet.contrib.amp, float16 with dynamic loss scaling) on a "
                          "CUDA GPU; the CPU wheel trains in float32 and says so (no float16 GEMM on the CPU, and "
                          "its bfloat16 convolutions need AVX-512)",
                 channels_last=True, channels_last_help="accepted for the PyTorch script's command lines; MXNet stays "
                                                        "NCHW and says so at start-up (NHWC convolutions need cuDNN, "
                                                        "and Gluon's model zoo builds NCHW models)",
                 checkpoint_every=True, checkpoint_every_default=0,
                 checkpoint_every_help="accepted for the PyTorch script's command lines; the MXNet script saves at "
                                       "epoch ends only (its loaders can resume mid-epoch: state_dict)",
                 debug=True, run_dir=True,
                 engine_help="gradient averaging; auto: horovod under horovodrun/mpirun, kvstore under a DMLC launcher",
                 resume_help="checkpoint (.params, or its folder) to resume from")
    add_multi_label_arg(parser)
    return parser


def ssd_detection(add_help: bool = True) -> argparse.ArgumentParser:
    parser = create_parser("crossdali SSD300 training", add_help=add_help)
    add_data_args(parser, backends=(*DALI_BACKENDS, "native", "synthetic"), sample_sizes=tuple(SIZES), crop_size=None,
                  data_help="COCO-format folder (annotations/instances_{train,val}.json, train/, val/)",
                  workers_help="DALI threads or DataLoader workers per process")
    add_model_args(parser, arch="resnet50", arches=_ssd_backbones(),
                   arch_help="torchvision ResNet for the backbone")
    parser.add_argument("--weights-backbone", type=Path, default=None,
                        help="local torchvision state dict for the backbone")
    add_optimizer_args(parser, batch_size=32, epochs=65, lr=2.6e-3, lr_batch=32, lr_warmup_epochs=1.0,
                       weight_decay=5e-4, label_smoothing=False, batch_help="images per process per step")
    parser.add_argument("--eval-every", type=int, default=1, help="epochs between COCO evaluations")
    add_run_args(parser, engines=ENGINES["pytorch"], amp=True, channels_last=False, checkpoint_every=True,
                 run_dir=True, debug=True, engine_help=_TORCH_ENGINE_HELP, resume_help=_TORCH_RESUME_HELP)
    return parser


def video_classification(add_help: bool = True) -> argparse.ArgumentParser:
    parser = create_parser("crossdali video classification training", add_help=add_help)
    add_data_args(parser, backends=(*DALI_BACKENDS, "synthetic"), sample_sizes=tuple(VIDEO_SIZES), workers=2,
                  crop_size=56, hw_decoder_load=False, workers_help="DALI threads per process",
                  data_help="folder with train.txt/val.txt ('<path> <label>' lines) or train/<class>/<video>")
    clips = parser.add_argument_group("clips")
    clips.add_argument("--clip-len", type=positive_int, default=8, help="frames per clip (sequence_length)")
    clips.add_argument("--frame-stride", type=positive_int, default=2, help="frames between consecutive clip frames")
    clips.add_argument("--clip-step", type=positive_int, default=None,
                       help="frames between clip starts (default clip-len * frame-stride)")
    clips.add_argument("--hflip", type=float, default=0.5, help="mirror probability (0 if labels are left/right)")
    clips.add_argument("--pipelines", type=positive_int, default=None,
                       help="DALI pipelines per process, each decoding its own part of the shard (batch-size / "
                            "pipelines clips each per step; the reads per step must divide by it). Default: on "
                            "dali-gpu the largest divisor of the reads per step (batch size / clips per read) up to "
                            "14, one read each at the default batch (val: of the batch size up to 7; several keep the "
                            "GPU's video decoders busy, one leaves them mostly idle), else 1")
    clips.add_argument("--clips-per-read", type=positive_int, default=None,
                       help="train: decode this many consecutive clips as one read, so each file's frames are decoded "
                            "once, not once per clip from the key frame before it; each clip keeps its own crop and "
                            "flip, and the clips of a read arrive in one batch. Default: 3 (3 clips of clip-len x "
                            "frame-stride = 16 frames span a key-frame interval of 48), or the largest smaller count "
                            "that divides the batch size and fits the shortest file. The batch size must divide by "
                            "it; a file's last clips that do not fill a read are left out (logged): 1 reads them all")
    add_model_args(parser, arch="small3d", arches=VIDEO_MODELS, arch_help="video model")
    add_optimizer_args(parser, batch_size=None, epochs=8, lr=3e-3, lr_batch=None, lr_warmup_epochs=1.0, opt="adamw",
                       batch_help="clips per process per step",
                       batch_default_help=f"; default: {GPU_TRAIN_BATCH} where a CUDA GPU trains "
                                          f"({GPU_TRAIN_BATCH // DEFAULT_CLIPS_PER_READ} reads of {DEFAULT_CLIPS_PER_READ} "
                                          f"clips, one for each of {GPU_TRAIN_PIPELINES} pipelines: fewer leave the "
                                          f"video decoders partly idle), {CPU_TRAIN_BATCH} on the CPU")
    add_run_args(parser, engines=ENGINES["pytorch"], amp=True, checkpoint_every=True, run_dir=True, debug=True,
                 print_freq=20, engine_help=_TORCH_ENGINE_HELP, resume_help=_TORCH_RESUME_HELP)
    return parser


#: (task, framework) -> the parser of the script ``crossdali train`` runs (``crossdali.cli.TRAIN_SCRIPTS``)
PARSERS: dict[tuple[str, str], Callable[..., argparse.ArgumentParser]] = {
    ("classification", "pytorch"): pytorch_classification,
    ("classification", "tensorflow"): tensorflow_classification,
    ("classification", "jax"): jax_classification,
    ("classification", "mxnet"): mxnet_classification,
    ("detection", "pytorch"): ssd_detection,
    ("video", "pytorch"): video_classification,
}
