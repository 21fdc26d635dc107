#!/usr/bin/env bash
# The GPU tests and every user benchmark on a GPU machine, one phase per call (docs/benchmarks.md).
#
#   bash benchmarks/run_on_gpu.sh PHASE [PHASE...]      # e.g. tests, training_speed, all
#
# Each benchmark phase runs `python -m benchmarks.<name>` (= `crossdali bench <name>`) with its default arguments
# and writes <name>.json (+ .png) into OUT (default results/latest); only where a default does not fit a GPU
# machine or a 10-minute call does the phase add flags, shown below:
#   tests                      pytest -m gpu over tests/ (TensorFlow's and MXNet's tests skip where those are absent)
#   parity                     python -m crossdali.parity gpu                        -> parity_gpu.json
#   optical_flow               python -m crossdali.video.optical_flow --sample-size gpu-tiny -> optical_flow.json
#   classification_loaders     the loader rows and the training rows
#   training_speed             --framework pytorch: the default command's rows beside the tuned ones
#   training_speed_jax         --framework jax
#   training_speed_tensorflow  --framework tensorflow --modes default --backends synthetic,dali-gpu (XLA rows take
#                              minutes each; needs TensorFlow staged)
#   gpu_timeline               --framework jax: an nsys trace of the default command per backend (needs nsys)
#   detection_loaders          builds the custom operator plugin, then every row incl. --fused-colour
#   video_decode, inference, external_source, loader_formats, proxy_loader (video_decode needs PyAV)
#   auto_augment               the loader's DALI GPU rows with each --auto-augment policy (--only "DALI GPU")
#                              -> auto_augment_loaders_gpu.json, then ResNet-50 training images/s per policy
#                              -> training_speed_auto_augment.json
#   global_order               the PyTorch script's training images/s, sharded order vs --global-order
#                              -> training_speed_global_order.json
#   predict_latency            Predictor's pipeline engine against PIL + torchvision (eager is CPU-only)
#   check_speed                --size bench --device gpu --copies 8 (the data checker on 65,560 files)
#   multi_gpu                  --gpus 1,2 --launchers torchrun (needs 2 GPUs)
#   tf_vs_torch                (needs TensorFlow staged)
#   tune                       crossdali tune (60 s), then every configuration of its grid, in one call (about
#                              9 minutes) -> tune.json
#   object_store               --rounds 2: the PyTorch loader from moto's S3 server on the loopback vs local disk
#                              (needs boto3 and moto[server] importable: wheels carried where there is no index)
#   soak                       --minutes 8: memory over the PyTorch script's default command (30 minutes by
#                              default, more than one 10-minute call) -> soak.json
#   all                        every phase above in this order: refreshes OUT (about an hour on one GPU)
#
# Logs go to LOGS (default OUT/logs when OUT is set, else /tmp/run_on_gpu-logs); LOGS/steps.txt lists each
# step's exit code and seconds. Each step has its own time limit: a step that hangs costs its limit, and a
# failing step is recorded while the phase goes on.
#
# DALI on a machine without a package index: the maintainers' stage-dali script writes the DALI wheels as
# .device-stage/p0..pN (48 MiB parts, one carried per call, each moved to /tmp/stage). This runner finishes
# what they start: parts found in .device-stage/ are moved to /tmp/stage, a complete set there is unpacked and
# installed into /tmp/site (its install.sh), and /tmp/site goes on PYTHONPATH. TensorFlow the same way
# (stage-tf: /tmp/tfenv.sh is sourced where it exists). An installed DALI is used as it is.
set -uo pipefail
cd "$(dirname "$0")/.."
(( $# )) || { sed -n '2,35p' "$0"; exit 2; }
phases=(tests parity optical_flow classification_loaders training_speed training_speed_jax training_speed_tensorflow gpu_timeline
        detection_loaders video_decode inference predict_latency external_source loader_formats proxy_loader check_speed
        multi_gpu tf_vs_torch tune object_store soak auto_augment global_order)
for phase in "$@"; do
  [[ " ${phases[*]} all " == *" $phase "* ]] || { echo "unknown phase '$phase': one of ${phases[*]} all" >&2; exit 2; }
done
nvidia-smi -L > /dev/null 2>&1 || { echo "$0: no NVIDIA GPU here (nvidia-smi -L failed): run it on a GPU machine" >&2; exit 2; }
out=${OUT:-results/latest}
logs=${LOGS:-${OUT:+$OUT/logs}}; logs=${logs:-/tmp/run_on_gpu-logs}
py=${PYTHON:-python3}
export CROSSDALI_DATA=${CROSSDALI_DATA:-/tmp/crossdali-data} PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$out" "$logs" "$CROSSDALI_DATA"

if compgen -G ".device-stage/p?" > /dev/null; then mkdir -p /tmp/stage && mv .device-stage/p? /tmp/stage/; fi
if ! "$py" -c "import nvidia.dali" 2> /dev/null && [ ! -d /tmp/site/nvidia/dali ] && compgen -G "/tmp/stage/p?" > /dev/null
then
  cat /tmp/stage/p? | tar x -C /tmp/stage && bash /tmp/stage/install.sh || echo "DALI stage incomplete or broken" >&2
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site:$PYTHONPATH
[ -f /tmp/tfenv.sh ] && . /tmp/tfenv.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; "$py" -c \
  "import sys, torch, nvidia.dali as d; print(sys.version.split()[0], 'torch', torch.__version__, 'DALI', d.__version__)"; } \
  > "$out/gpu_machine.txt" 2>&1
cat "$out/gpu_machine.txt"

step() {  # step NAME SECONDS CMD...: run CMD with a time limit, log to LOGS/NAME.log, record the exit code
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout --signal=INT --kill-after=15 "$limit" "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc seconds=$((SECONDS - t0))" | tee -a "$logs/steps.txt"
  tail -n 20 "$logs/$name.log"
}
bench() {  # bench STEP MODULE SECONDS FLAGS...: a benchmark into OUT; its side logs (engine loads, runs) to LOGS
  local name=$1 module=$2 limit=$3; shift 3
  step "$name" "$limit" "$py" -m "benchmarks.$module" --out "$out" "$@"
  mv -f "$out"/dmon_*.log "$out"/*_dmon.log "$out"/training_speed_*.log "$logs"/ 2> /dev/null
  [ "$out/logs" -ef "$logs" ] || mv -f "$out/logs" "$logs/${name}_logs" 2> /dev/null
}
has() { "$py" -c "import $1" 2> /dev/null || { echo "$2: skipped, $1 is not importable" | tee -a "$logs/steps.txt"; false; }; }
with_gpu() {  # with_gpu SRC DST: a JSON written by crossdali itself, copied with the GPU model added ("gpu")
  "$py" -c "import json, sys; d = json.load(open(sys.argv[1])); d.setdefault('gpu', sys.argv[3]); \
open(sys.argv[2], 'w').write(json.dumps(d, indent=2) + '\n')" "$1" "$2" "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
}
sample_sets() {  # JPEG folders and WebDataset shards only: the staged tfrecord wheel does not import here
  step sample_sets 300 "$py" -m crossdali make-data --kind classification --size bench --formats imagefolder,webdataset
}

run_phase() {
  case $1 in
    tests) step gpu_tests 580 "$py" -m pytest tests -m gpu -rA -p no:cacheprovider -q --durations=15
      cp "$logs/gpu_tests.log" "$out/" ;;
    parity) step parity_gpu 300 "$py" -m crossdali.parity gpu --out "$logs/parity_gpu" \
      && with_gpu "$logs/parity_gpu/summary.json" "$out/parity_gpu.json" ;;
    optical_flow) step optical_flow 120 "$py" -m crossdali.video.optical_flow --sample-size gpu-tiny \
      --output-dir "$logs/optical_flow" && with_gpu "$logs/optical_flow/summary.json" "$out/optical_flow.json" \
      && cp "$logs/optical_flow/optical_flow.png" "$out/" ;;
    classification_loaders) sample_sets; bench classification_loaders classification_loaders 580 ;;
    training_speed) sample_sets; bench training_speed training_speed 590 --framework pytorch ;;
    training_speed_jax) sample_sets; bench training_speed_jax training_speed 590 --framework jax ;;
    training_speed_tensorflow) has tensorflow "$1" && { sample_sets
      bench training_speed_tensorflow training_speed 590 --framework tensorflow --modes default --backends synthetic,dali-gpu; } ;;
    gpu_timeline) if command -v nsys > /dev/null; then sample_sets; bench gpu_timeline gpu_timeline 590 --framework jax
      else echo "gpu_timeline: skipped, needs nsys on PATH" | tee -a "$logs/steps.txt"; fi ;;
    detection_loaders) step plugin_build 240 "$py" -m crossdali.common.plugins build
      bench detection_loaders detection_loaders 540 --seconds 10 --fused-colour --budget-s 480 ;;
    video_decode) has av "$1" && bench video_decode video_decode 590 --work "$CROSSDALI_DATA/video-bench" ;;
    inference) sample_sets; bench inference inference 420 ;;
    predict_latency) sample_sets; bench predict_latency predict_latency 420 ;;
    external_source) sample_sets; bench external_source external_source 420 ;;
    loader_formats) sample_sets; bench loader_formats loader_formats 580 ;;
    proxy_loader) sample_sets; bench proxy_loader proxy_loader 420 ;;
    check_speed) sample_sets; bench check_speed check_speed 420 --size bench --device gpu --copies 8 ;;
    multi_gpu) if (( $(nvidia-smi -L | wc -l) < 2 )); then echo "multi_gpu: skipped, needs 2 GPUs" | tee -a "$logs/steps.txt"
      else sample_sets; bench multi_gpu multi_gpu 580 --gpus 1,2 --launchers torchrun; fi ;;
    tf_vs_torch) has tensorflow "$1" && { sample_sets; bench tf_vs_torch tf_vs_torch 420; } ;;
    tune) sample_sets; bench tune tune 590 ;;
    object_store) has moto "$1" && has boto3 "$1" && { sample_sets; bench object_store object_store 580 --rounds 2; } ;;
    soak) sample_sets; bench soak soak 590 --minutes 8 ;;
    auto_augment) sample_sets
      bench auto_augment_loaders classification_loaders 300 --skip-train --hw-loads 1 --threads "" --pipelines "" \
        --auto-augment autoaugment,randaugment,trivialaugment --only "DALI GPU"
      mv -f "$out/classification_loaders.json" "$out/auto_augment_loaders_gpu.json" 2> /dev/null
      mv -f "$out/classification_loaders.png" "$out/auto_augment_loaders_gpu.png" 2> /dev/null
      bench training_speed_auto_augment training_speed 590 --framework pytorch --backends dali-gpu --modes tuned \
        --variant none= --variant trivialaugment='--auto-augment trivialaugment' \
        --variant randaugment='--auto-augment randaugment' --variant autoaugment='--auto-augment autoaugment'
      mv -f "$out/training_speed_pytorch.json" "$out/training_speed_auto_augment.json" 2> /dev/null
      mv -f "$out/training_speed_pytorch.png" "$out/training_speed_auto_augment.png" 2> /dev/null ;;
    global_order) sample_sets
      bench training_speed_global_order training_speed 590 --framework pytorch --modes tuned --backends dali-gpu \
        --variant sharded= --variant global=--global-order
      mv -f "$out/training_speed_pytorch.json" "$out/training_speed_global_order.json" 2> /dev/null
      mv -f "$out/training_speed_pytorch.png" "$out/training_speed_global_order.png" 2> /dev/null ;;
  esac
}

for phase in "$@"; do
  if [ "$phase" = all ]; then for p in "${phases[@]}"; do run_phase "$p"; done; else run_phase "$phase"; fi
done
