#!/usr/bin/env bash
# The GPU measurements behind the README's tables, in phases that each fit one 10-minute device call.
#
#   bash benchmarks/gpu_session.sh classification|classpeers|trainstream|trainrounds|trainshape|trainloop|trainer|trainfix|trainlag|trainlag2|traincopy|trainercopy|trainpipes|traingrid|trainerj4|trainprio|trainhalf|trainlong|trainlong2|trainprio2|trainahead|traingraphs|traingraphs2|classgrid|classall|trainjax|trainjax2|trainjax8|video|videoprof|videoloader|legacyprobe|videox264|videogop16|videoread|videoread2|videoread3|sameday1|sameday2|sameday3|multigpu|multigpu2|multigpu4|ddptests|tfsame1|tfxla|tfsame2|tfnative|tfahead|tfahead2|detection|decodeprobe|tests|tf|tfbench|core|core2|check|checkdepth|checkprof|checkab|checkahead|formats|lists|inference|pack [OUT]
#
# tf: the TensorFlow GPU tests (classification, detection, video batches on the GPU) and the GPU parity
# harness with every framework present; tfbench: TF vs PyTorch dali-gpu images/s in one process, then
# Keras ResNet-50 AMP training fed by synthetic data, dali-gpu and native, one row after another (before XLA;
# since 2026-11-27: tfsame1, tfxla, tfsame2).
# core: every GPU-marked test of the frameworks present, the GPU parity harness (all frameworks,
# hardware JPEG decoder on and off) and the data checker's speed; pack: everything under OUT in one
# archive (the device hands back at most 8 files), as OUT/gpu-results.tgz. check: the data checker's
# GPU verdicts against the CPU's, and its speed on the bench set (header processes by default and none; batch 64 and 256).
#
# Needs DALI importable (on the lent H100: ../shared/gpu/stage-dali, then PYTHONPATH=/tmp/site:$PWD);
# the tf phase needs TensorFlow too (../shared/gpu/stage-tf, then . /tmp/tfenv.sh). stage-tf writes 60 MiB parts and a
# device call carries 64 MiB, the tracked tree (6.3 MiB on 2026-11-27) included, so every part call was refused that
# day; re-split first: cat .device-stage-tf/t* > /tmp/tf.tar && rm .device-stage-tf/t* &&
# split -b 55M -d -a 2 /tmp/tf.tar .device-stage-tf/t   (54 parts on 2026-11-27; the last call's `cat t??` unpacks them alike)
# Writes under OUT (default $OUT, else results/gpu): each benchmark's JSON (+ PNG where matplotlib or
# Pillow is there), its log, and the GPU-marked tests' report. Every step has its own time limit, so
# a step that hangs costs its limit, not the phase; a failing step is recorded and the phase goes on.
set -uo pipefail
phase=${1:?usage: gpu_session.sh classification|classpeers|trainstream|trainrounds|trainshape|trainloop|trainer|trainfix|trainlag|trainlag2|traincopy|trainercopy|trainpipes|traingrid|trainerj4|trainprio|trainhalf|trainlong|trainlong2|trainprio2|trainahead|traingraphs|traingraphs2|classgrid|classall|trainjax|trainjax2|trainjax8|video|videoprof|videoloader|legacyprobe|videox264|videogop16|videoread|videoread2|videoread3|sameday1|sameday2|sameday3|multigpu|multigpu2|multigpu4|ddptests|tfsame1|tfxla|tfsame2|tfnative|tfahead|tfahead2|detection|decodeprobe|tests|tf|tfbench|core|core2|check|checkdepth|checkprof|checkab|checkahead|formats|lists|inference|pack [OUT]}
out=${2:-${OUT:-results/gpu}}
py=${PYTHON:-python3}
export CROSSDALI_DATA=${CROSSDALI_DATA:-/tmp/crossdali-data}
mkdir -p "$out" "$CROSSDALI_DATA"

step() {  # step NAME SECONDS CMD...: run CMD with a time limit, log to OUT/NAME.log, record the exit code
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout --signal=INT --kill-after=15 "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc seconds=$((SECONDS - t0))" | tee -a "$out/steps.txt"
  tail -n 25 "$out/$name.log"
}

dmon_step() {  # dmon_step NAME SECONDS CMD...: step, with nvidia-smi dmon -s u (1 s engine loads) logged to OUT/dmon_NAME.log
  local name=$1; nvidia-smi dmon -s u > "$out/dmon_$name.log" 2>&1 & local dmon=$!
  step "$@"; kill "$dmon" 2>/dev/null; wait "$dmon" 2>/dev/null
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; "$py" -c \
  "import sys, torch, nvidia.dali as d; print(sys.version.split()[0], 'torch', torch.__version__, 'DALI', d.__version__)"; } \
  > "$out/machine-$phase.txt" 2>&1
cat "$out/machine-$phase.txt"

case $phase in
  classification)
    step classification_loaders 330 "$py" -m benchmarks.classification_loaders --out "$out" ;;
  classpeers)  # issue 14: the SPDL rows beside the others (needs the extras staged, /tmp/site-extra on PYTHONPATH,
    # PEER_LD_PATH=/tmp/site-extra/av.libs for SPDL's FFmpeg), and every training row with and without a device
    # sync after each batch fetch; the thread and hardware-share sweeps cut to the configurations that won on 11-26
    step classification_peers 560 env LD_LIBRARY_PATH="${PEER_LD_PATH:-}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
      "$py" -m benchmarks.classification_loaders --out "$out" --hw-loads 0.75,0.85,1.0 --threads 4 --train-threads 4,15 ;;
  trainstream)  # issue 14, training at synthetic speed: the model on a high-priority stream beside the default one,
    # synthetic and dali-gpu rows, twice in separate processes (100 timed steps each)
    for run in 1 2; do
      step train_stream_$run 255 "$py" -m benchmarks.classification_loaders --out "$out/train_stream_$run" --skip-loader \
        --train-sync none --train-stream default,high --train-threads 4,15 --train-steps 100
    done ;;
  trainrounds)  # issue 14: is dali-gpu training at 97 % of synthetic? Four interleaved rounds of 300 timed steps
    # each (synthetic, dali-gpu, synthetic, ...), so the ratio comes with its round-to-round spread
    step train_rounds 430 "$py" -m benchmarks.classification_loaders --out "$out/train_rounds" --skip-loader \
      --train-sync none --train-backends synthetic,dali-gpu --train-threads 4 --train-rounds 4 --train-steps 300 ;;
  trainshape)  # the same rounds with the loaders' default last batch (partial: one 3-image step per epoch on the
    # bench set, which synthetic does not have) and with every row's batches full (drop), one run after the other
    for policy in partial drop; do
      step train_rounds_$policy 280 "$py" -m benchmarks.classification_loaders --out "$out/train_rounds_$policy" \
        --skip-loader --train-sync none --train-backends synthetic,dali-gpu --train-threads 4 --train-rounds 4 \
        --train-steps 200 --train-last-batch $policy
    done ;;
  trainloop)  # issue 14: is the 6-7 % gap the host waiting for the batch, or DALI's GPU work beside the model's?
    # Three interleaved rounds of synthetic and dali-gpu under three loops (plain SGD, whose GradScaler waits for
    # the device every step; fused SGD, with which the host runs ahead; fused SGD + the next batch fetched before
    # the loss is read), then 20 profiled steps per row: GPU ms per step by CUDA stream. (Its 11-26 run and a
    # trainknobs phase that varied the prefetch depth and the CUDA queues trained NaN weights in every fused row,
    # see trainfix; their results were withdrawn. Both loops are valid since create_optimizer's fix.)
    step train_loop 500 "$py" -m benchmarks.classification_loaders --out "$out/train_loop" --skip-loader \
      --train-sync none --train-backends synthetic,dali-gpu --train-threads 4 --train-rounds 3 --train-steps 150 \
      --train-loop scaler,fused,lookahead --train-profile-steps 20 ;;
  trainer)  # issue 14: the PyTorch training script itself (fused SGD on the GPU, each loss read one step late, 32
    # CUDA queues; synthetic batches of the data loaders' sizes), synthetic and dali-gpu interleaved over three
    # rounds; then two rounds with CUDA's 8 queues
    step trainer_queues32 250 "$py" -m benchmarks.training_speed --framework pytorch --backends synthetic,dali-gpu \
      --rounds 3 --epochs 4 --timeout 90 --out "$out/trainer_queues32"
    step trainer_queues8 200 env CUDA_DEVICE_MAX_CONNECTIONS=8 "$py" -m benchmarks.training_speed --framework pytorch \
      --backends synthetic,dali-gpu --rounds 2 --epochs 4 --timeout 90 --out "$out/trainer_queues8" ;;
  trainfix)  # issue 14, after the trainer turned NaN: PyTorch 2.11's fused SGD left its momentum buffers uninitialised
    # when GradScaler skipped the first steps, so the fused rows of trainloop and trainknobs trained NaN weights. Again
    # with the buffers made first (create_optimizer): plain and fused SGD, 32 CUDA queues and CUDA's 8, then the
    # training script itself under both
    for q in 32 unset; do
      step train_fix_queues_${q/unset/8} 160 "$py" -m benchmarks.classification_loaders --cuda-queues $q \
        --out "$out/train_fix_queues_${q/unset/8}" --skip-loader --train-sync none --train-backends synthetic,dali-gpu \
        --train-threads 4 --train-rounds 2 --train-steps 120 --train-loop scaler,fused --train-profile-steps 10
    done
    step trainer_queues32 110 "$py" -m benchmarks.training_speed --framework pytorch --backends synthetic,dali-gpu \
      --rounds 2 --epochs 4 --timeout 60 --out "$out/trainer_queues32"
    step trainer_queues8 110 env CUDA_DEVICE_MAX_CONNECTIONS=8 "$py" -m benchmarks.training_speed --framework pytorch \
      --backends synthetic,dali-gpu --rounds 2 --epochs 4 --timeout 60 --out "$out/trainer_queues8" ;;
  trainlag)  # issue 14: the training script reaches 93 % of synthetic where the benchmark's fused loop reaches 97 %.
    # The script's loop in the benchmark (fused SGD, each loss read one step late) beside the fused one, with cuDNN's
    # autotuner (the benchmark's default) and without it (the script's, for reproducible runs: CUDNN_BENCHMARK=0)
    for tune in 1 0; do
      step train_lag_cudnn_benchmark_$tune 160 env CUDNN_BENCHMARK=$tune "$py" -m benchmarks.classification_loaders \
        --out "$out/train_lag_cudnn_benchmark_$tune" --skip-loader --train-sync none --train-backends synthetic,dali-gpu \
        --train-threads 4 --train-rounds 2 --train-steps 120 --train-loop fused,lagged
    done ;;
  trainlag2)  # issue 14, after trainlag put the script's 93-94 % on its one-step-late loss read: how far must the host
    # run ahead? The loss read one, two and three steps late beside the fused loop that never reads it
    step train_lag_depth 230 "$py" -m benchmarks.classification_loaders --out "$out/train_lag_depth" --skip-loader \
      --train-sync none --train-backends synthetic,dali-gpu --train-threads 4 --train-rounds 2 --train-steps 100 \
      --train-loop fused,lagged,lagged2,lagged3 ;;
  traincopy)  # issue 14: the 'lagged' loops read the loss tensor, and that read is copied behind every kernel queued
    # since it, so each drains the GPU's queue. The loss copied to pinned host memory at its step and read one or two
    # steps late after that copy's event (crossdali's trainer since), beside the fused loop and the old read; then the
    # trainer's GPU tests (the read returns while later work still runs)
    step train_copy 260 "$py" -m benchmarks.classification_loaders --out "$out/train_copy" --skip-loader \
      --train-sync none --train-backends synthetic,dali-gpu --train-threads 4 --train-rounds 2 --train-steps 120 \
      --train-loop fused,lagged,copied,copied2
    step tracker_gpu_tests 120 "$py" -m pytest -q -p no:cacheprovider -m gpu tests/pytorch/test_training.py ;;
  trainercopy)  # issue 14: the PyTorch training script with the loss copied at its step (the trainer's fix), three
    # interleaved rounds as in 'trainer'
    step trainer_copy_queues32 300 "$py" -m benchmarks.training_speed --framework pytorch --backends synthetic,dali-gpu \
      --rounds 3 --epochs 4 --timeout 90 --out "$out/trainer_copy_queues32" ;;
  classgrid)  # issue 14, classification >= 10x native: 2 pipelines keep the JPEG engines 92-100 % busy (20.7-21.1k
    # images/s, 9.3-9.8x native). Past the engines? 2 and 4 pipelines with a share of the JPEGs on nvJPEG's CUDA
    # decoder (Huffman on the pipelines' CPU threads, hw_decoder_load < 1), beside native, PIL and torchvision's GPU
    # decode_jpeg in the same run (no training rows)
    step class_grid 420 "$py" -m benchmarks.classification_loaders --out "$out/class_grid" --skip-train \
      --hw-loads 1 --threads "" --pipelines 2,4 --pipeline-hw-loads 0.7,0.8,0.9,1 ;;
  trainpipes)  # issue 14: the PyTorch training script with its dali-gpu loader split over 1 and 2 pipelines (2 loaded
    # 10.8-11.9x native on 2026-11-26, 1 only 8.3-9.1x; does a second pipeline slow the model it feeds?), beside
    # synthetic, three interleaved rounds as in 'trainercopy' (the bench set built first: about a minute on 16 cores)
    step bench_set 150 "$py" -c "from crossdali.common.sample_data import ensure_classification as e; print(e(size='bench'))"
    step trainer_pipelines 470 "$py" -m benchmarks.training_speed --framework pytorch \
      --backends synthetic,dali-gpu,dali-gpu:2 --rounds 3 --epochs 4 --timeout 90 --out "$out/trainer_pipelines" ;;
  traingrid)  # issue 14, the last points to 97 %: the trainer's loop ('copied') with 2 / 4 DALI threads and DALI
    # prefetch depths 1 / 2 / 3, beside synthetic, two interleaved rounds
    step train_grid 400 "$py" -m benchmarks.classification_loaders --out "$out/train_grid" --skip-loader \
      --train-sync none --train-backends synthetic,dali-gpu --train-threads 2,4 --train-rounds 2 --train-steps 120 \
      --train-loop copied --train-prefetch 1,2,3 ;;
  trainerj4)  # the PyTorch script with its own default of 4 DALI threads (-j 4; the benchmark's default is cores - 1,
    # 15 here), three interleaved rounds as in 'trainercopy'
    step trainer_j4 330 "$py" -m benchmarks.training_speed --framework pytorch --backends synthetic,dali-gpu \
      --workers 4 --rounds 3 --epochs 4 --timeout 90 --out "$out/trainer_j4" ;;
  trainprio)  # issue 14: the model on a CUDA stream of the highest priority, again, now that the loop no longer waits
    # (32 queues, fused SGD, loss copied at its step; 'trainstream' found no effect with 8 queues and GradScaler's
    # per-step wait): DALI's kernels, what is left of the gap, then yield the SMs to the model's
    step bench_set 150 "$py" -c "from crossdali.common.sample_data import ensure_classification as e; print(e(size='bench'))"
    step train_prio 300 "$py" -m benchmarks.classification_loaders --out "$out/train_prio" --skip-loader \
      --train-sync none --train-backends synthetic,dali-gpu --train-threads 4 --train-rounds 3 --train-steps 120 \
      --train-loop copied --train-stream default,high ;;
  trainhalf)  # issue 14: the PyTorch script before (BASE: a copy of the tree before, whose float32 NCHW batches were
    # copied to channels-last on the GPU every step) and after (the batch a view of DALI's NHWC output; run on 2026-11-27
    # at 4899361, where DALI also wrote float16), alternating, one round each (ROUNDS: which, default 1); bench set first
    base=${BASE:?trainhalf needs BASE=<the tree before, e.g. git archive a614e03 | tar x -C DIR>}
    step bench_set 150 "$py" -c "from crossdali.common.sample_data import ensure_classification as e; print(e(size='bench'))"
    for r in ${ROUNDS:-1}; do
      step train_half_before_$r 170 bash -c "cd '$base' && exec '$py' -m benchmarks.training_speed --framework pytorch \
        --backends synthetic,dali-gpu --rounds 1 --epochs 4 --timeout 80 --out '$(realpath "$out")/train_half_before_$r'"
      step train_half_after_$r 170 "$py" -m benchmarks.training_speed --framework pytorch --backends synthetic,dali-gpu \
        --rounds 1 --epochs 4 --timeout 80 --out "$out/train_half_after_$r"
    done ;;
  trainlong)  # issue 14, is the PyTorch script at 97 % of synthetic? Its rounds spread 96.0-97.7 % with 99 timed steps
    # a row; here 231 (--epochs 8) in four interleaved rounds, each step's time in the JSON, the epoch's last step
    # timed to its own kernels (not to the loader's prefetch as before), engine loads beside; bench set first
    step bench_set 150 "$py" -c "from crossdali.common.sample_data import ensure_classification as e; print(e(size='bench'))"
    dmon_step train_long 440 "$py" -m benchmarks.training_speed --framework pytorch --backends synthetic,dali-gpu \
      --rounds 4 --epochs 8 --timeout 100 --out "$out/train_long" ;;
  trainlong2)  # the same, the benchmark's 15 DALI threads beside the script's own default of 4 (-j 4), three interleaved
    # rounds (its 2026-11-27 run had a first try at a steady rate, 'mid_epoch', since replaced by 'steady': README)
    step bench_set 150 "$py" -c "from crossdali.common.sample_data import ensure_classification as e; print(e(size='bench'))"
    dmon_step train_long2 470 "$py" -m benchmarks.training_speed --framework pytorch --backends synthetic,dali-gpu \
      --variant j15= --variant j4='-j 4' --rounds 3 --epochs 8 --timeout 100 --out "$out/train_long2" ;;
  trainprio2)  # issue 14: the PyTorch script with the model on a CUDA stream of the highest priority (--model-stream high)
    # beside the default stream, each beside its own synthetic row, interleaved rounds (ROUNDS, default 3), 231 timed steps
    step bench_set 150 "$py" -c "from crossdali.common.sample_data import ensure_classification as e; print(e(size='bench'))"
    dmon_step train_prio2 530 "$py" -m benchmarks.training_speed --framework pytorch --backends synthetic,dali-gpu \
      --variant default= --variant high='--model-stream high' --rounds "${ROUNDS:-3}" --epochs 8 --timeout 100 \
      --out "$out/train_prio2" ;;
  trainahead)  # issue 14: the PyTorch script reading each loss 1 or 2 steps late (--steps-ahead), each beside its own
    # synthetic row, interleaved rounds (ROUNDS, default 3), 231 timed steps; gpu_wait_s (the host's lead) per step
    step bench_set 150 "$py" -c "from crossdali.common.sample_data import ensure_classification as e; print(e(size='bench'))"
    dmon_step train_ahead 530 "$py" -m benchmarks.training_speed --framework pytorch --backends synthetic,dali-gpu \
      --variant a1='--steps-ahead 1' --variant a2='--steps-ahead 2' --rounds "${ROUNDS:-3}" --epochs 8 --timeout 100 \
      --out "$out/train_ahead" ;;
  traingraphs)  # issue 14: the PyTorch script eager (--cuda-graphs off; when first run, eager was the default) and
    # graphed (--cuda-graphs on), each beside its own synthetic row, interleaved rounds (ROUNDS, default 2), 231 timed
    # steps; first the GPU tests of the graphed model
    step graphs_gpu_tests 120 "$py" -m pytest -q -p no:cacheprovider -m gpu tests/pytorch/test_training.py
    step bench_set 150 "$py" -c "from crossdali.common.sample_data import ensure_classification as e; print(e(size='bench'))"
    dmon_step train_graphs 540 "$py" -m benchmarks.training_speed --framework pytorch --backends synthetic,dali-gpu \
      --variant eager='--cuda-graphs off' --variant graphs='--cuda-graphs on' --rounds "${ROUNDS:-2}" --epochs 8 --timeout 100 \
      --out "$out/train_graphs" ;;
  traingraphs2)  # issue 14: the script's default (--cuda-graphs auto: graphed on one GPU) against --cuda-graphs off,
    # each beside its own synthetic row, interleaved rounds (ROUNDS, default 3), 231 timed steps
    step bench_set 150 "$py" -c "from crossdali.common.sample_data import ensure_classification as e; print(e(size='bench'))"
    dmon_step train_graphs2 560 "$py" -m benchmarks.training_speed --framework pytorch --backends synthetic,dali-gpu \
      --variant default='' --variant off='--cuda-graphs off' --rounds "${ROUNDS:-3}" --epochs 8 --timeout 100 \
      --out "$out/train_graphs2" ;;
  classall)  # issue 14, classification: every peer in one run, SPDL staged (spdl-core/spdl-io 0.8.0 wheels beside
    # DALI's; its FFmpeg is PyAV's, whose libraries carry auditwheel's hashed names, so SPDL gets links with the
    # names it loads; PyAV's folder on the path too, for the libraries those load by hashed name: $ORIGIN is the
    # link's folder), 1 and 2 dali-gpu pipelines (2 at hardware shares 0.9 and 1), no training rows
    links=/tmp/spdl-ffmpeg; avlibs=${SITE:-/tmp/site}/av.libs; mkdir -p "$links"
    for lib in "$avlibs"/lib{avcodec,avdevice,avfilter,avformat,avutil,swresample,swscale}-*.so.*; do
      [ -e "$lib" ] || continue
      base=${lib##*/}; major=${base#*.so.}; ln -sf "$lib" "$links/${base%%-*}.so.${major%%.*}"
    done
    ls "$links" > "$out/spdl_ffmpeg_links.txt"
    step class_all 540 env LD_LIBRARY_PATH="$links:$avlibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$py" \
      -m benchmarks.classification_loaders --out "$out/class_all" --skip-train --hw-loads 1 --threads "" \
      --pipelines 2 --pipeline-hw-loads 0.9,1 ;;
  trainjax)  # issue 14: the JAX training script on the GPU (never measured before), synthetic and dali-gpu interleaved
    # over two rounds; the loss read one step late and the learning rates computed on the CPU (reading either right
    # after dispatch waits for the step), with the 32 CUDA queues the script now sets. A process takes about 100 s
    # (XLA compiles for 40-50 s), so the second round's dali-gpu row ran past this limit on 2026-11-26
    step trainer_jax_queues32 330 "$py" -m benchmarks.training_speed --framework jax --backends synthetic,dali-gpu \
      --rounds 2 --epochs 3 --timeout 150 --out "$out/trainer_jax_queues32" ;;
  trainjax2)  # 'trainjax' with room for both rounds (its 330 s cut the second on 2026-11-26): the bench set first
    step bench_set 150 "$py" -c "from crossdali.common.sample_data import ensure_classification as e; print(e(size='bench'))"
    step trainer_jax_rounds 520 "$py" -m benchmarks.training_speed --framework jax --backends synthetic,dali-gpu \
      --rounds 2 --epochs 3 --timeout 150 --out "$out/trainer_jax_rounds" ;;
  trainjax8)  # one round with the 32 CUDA queues the script sets, then one with CUDA's 8 (set before it starts)
    step trainer_jax_round_queues32 240 "$py" -m benchmarks.training_speed --framework jax --backends synthetic,dali-gpu \
      --epochs 3 --timeout 150 --out "$out/trainer_jax_round_queues32"
    step trainer_jax_round_queues8 240 env CUDA_DEVICE_MAX_CONNECTIONS=8 "$py" -m benchmarks.training_speed \
      --framework jax --backends synthetic,dali-gpu --epochs 3 --timeout 150 --out "$out/trainer_jax_round_queues8" ;;
  video)  # issue 14: both DALI readers, fn.decoders.video, the GPU peers (PyNvVideoCodec, torchcodec: staged
    # into /tmp/site-extra by .device-stage/x*, on PYTHONPATH, PEER_LD_PATH=/tmp/site-extra/av.libs), the
    # CPU decoders; gop48 test videos (PyAV) at 1080p (every configuration) and 720p (the best ones)
    step video_decode 560 "$py" -m benchmarks.video_decode --out "$out" --work "$CROSSDALI_DATA/video-bench" ;;
  videoprof)  # where the DALI rows lose to the hardware: test videos with a key frame every clip (gop16), both
    # readers with 48-frame clips on the gop48 files (every clip starts at a key frame), then nsys over crossdali's
    # reader x7 (CUDA API, kernel and OS-runtime summaries into nsys_video.log). On the lent H100 of 2026-11-26 nsys
    # was not on PATH (exit 127); the copy inside Nsight Compute collected but hung writing its report
    best=(--only "DALI reader x1 (" --only "DALI reader x7 (" --only "DALI reader x14 (" --only "DALI legacy readers.video x1 ("
          --only "DALI legacy readers.video x7 (" --only "DALI legacy readers.video x14 (" --only "PyNvVideoCodec SimpleDecoder x14")
    step video_decode_gop16 200 "$py" -m benchmarks.video_decode --out "$out/gop16" --encode gop16 \
      --resolutions 1080p "${best[@]}" --work "$CROSSDALI_DATA/video-bench"
    step video_decode_clips48 150 "$py" -m benchmarks.video_decode --out "$out/clips48" --resolutions 1080p \
      --only "48-frame" --no-peers --work "$CROSSDALI_DATA/video-bench"
    step nsys_video 150 nsys profile --stats=true --trace=cuda,nvtx,osrt --sample=none --cpuctxsw=none \
      --force-overwrite=true --output=/tmp/nsys_video "$py" -m benchmarks.video_decode --out "$out/nsys_rows" \
      --resolutions 1080p --only "DALI reader x7 (one" --no-peers --seconds 4 --work "$CROSSDALI_DATA/video-bench" ;;
  videoloader)  # crossdali's loader (1, 4, 7 pipelines; train order, then val) beside the raw reader rows in
    # training's order (clips shuffled: both readers) and the legacy reader in file order, 1080p gop48, each
    # group in its own process (the 7-pipeline loader row of the experimental reader crashed once with SIGSEGV
    # on 2026-11-26 and not in 2 reruns: faulthandler's Python stacks if it comes back); then the GPU video tests
    export PYTHONFAULTHANDLER=1
    vd=("$py" -m benchmarks.video_decode --resolutions 1080p --no-peers --work "$CROSSDALI_DATA/video-bench")
    step video_loader 260 "${vd[@]}" --out "$out/loader" --only "crossdali loader (PyTorch)"
    step video_reader_rows 150 "${vd[@]}" --out "$out/readers" \
      --only "shuffled clips" --only "DALI legacy readers.video x7 (one" --only "DALI reader x7 (one"
    step video_gpu_tests 150 "$py" -m pytest tests/video -m gpu -rA -p no:cacheprovider -q ;;
  legacyprobe)  # what the legacy fn.readers.video does where the loaders depend on it (clip rule, output
    # devices, checkpointing, shards, VP9 WebM), then the loader rows of one process in a row (the order
    # that crashed with SIGSEGV on 2026-11-26, faulthandler on)
    export PYTHONFAULTHANDLER=1
    step legacy_reader_probe 120 "$py" -m benchmarks.legacy_reader_probe --out "$out/probe"
    step video_loader_rows 200 "$py" -m benchmarks.video_decode --resolutions 1080p --no-peers \
      --work "$CROSSDALI_DATA/video-bench" --out "$out/loader_rows" --only "crossdali loader (PyTorch)" ;;
  videox264)  # the x264-default encode (what cameras and the web produce: key frames up to 250 apart, so one per
    # 144-frame test file) at 1080p: the readers in file order and shuffled, crossdali's loader, PyNvVideoCodec
    step video_decode_x264 540 "$py" -m benchmarks.video_decode --out "$out/x264_default" --encode x264-default \
      --resolutions 1080p --work "$CROSSDALI_DATA/video-bench" \
      --only "DALI reader x1 (" --only "DALI reader x7 (" --only "shuffled clips" --only "DALI legacy readers.video x7 (" \
      --only "crossdali loader (PyTorch)" --only "PyNvVideoCodec SimpleDecoder x14" ;;
  videogop16)  # issue 14: crossdali's loader in training's order (clips shuffled) and val on files with a key frame at
    # every clip start (gop16: what a training set re-encoded for 16-frame clips gives), beside the raw shuffled
    # readers: on the gop48 files each shuffled clip decodes from the key frame before it (1,759-1,760 frames/s)
    step video_loader_gop16 300 "$py" -m benchmarks.video_decode --out "$out/loader_gop16" --encode gop16 \
      --resolutions 1080p --no-peers --work "$CROSSDALI_DATA/video-bench" \
      --only "crossdali loader (PyTorch)" --only "shuffled clips" ;;
  videoread)  # issue 14, video on files with key frames further apart than a clip: crossdali's loader (7 pipelines)
    # reading 3 consecutive 16-frame clips as one 48-frame read (clips_per_read=3: every read starts on a gop48
    # key frame) beside one clip at a time and the raw legacy reader (48-frame clips on key frames: the hardware's
    # rate; shuffled 16-frame clips), two rounds; then x264's defaults (a key frame per 144-frame file) with reads of
    # 9 clips = whole files; then the GPU video tests
    vd=("$py" -m benchmarks.video_decode --resolutions 1080p --no-peers --work "$CROSSDALI_DATA/video-bench")
    for round in 1 2; do
      step video_read_gop48_$round 260 "${vd[@]}" --out "$out/read_gop48_$round" \
        --only "crossdali loader (PyTorch), 7 pipelines" --only "DALI legacy readers.video x14, 48-frame clips" \
        --only "DALI legacy readers.video x7, shuffled clips"
    done
    step video_read_x264 200 "${vd[@]}" --out "$out/read_x264" --encode x264-default --read-rows 9x2,9x1 \
      --only "crossdali loader (PyTorch), 7 pipelines" --only "DALI legacy readers.video x7, shuffled clips"
    step video_gpu_tests 150 "$py" -m pytest tests/video -m gpu -rA -p no:cacheprovider -q ;;
  videoread2)  # videoread continued, beside NVIDIA's PyNvVideoCodec 2.2.4 in the same run (its wheel installed into
    # /tmp/site-extra, on PYTHONPATH; PyNvVideoCodec decodes whole files in order, the loader shuffled reads): reads
    # of 3 clips with 7 and 14 pipelines, 1 or 2 reads per pipeline and step (42 reads an epoch: whole steps), two
    # rounds; then 28 files with 4 reads per pipeline and step (84 reads: whole steps), where 14 files left the last
    # step of each pipeline's epoch half padding in videoread
    vd=("$py" -m benchmarks.video_decode --resolutions 1080p --work "$CROSSDALI_DATA/video-bench")
    for round in 1 2; do
      step video_read2_gop48_$round 200 "${vd[@]}" --out "$out/read2_gop48_$round" --read-rows 3x2,3x1 \
        --read-pipelines 7,14 --only "clips per read" --only "PyNvVideoCodec SimpleDecoder x7 " \
        --only "PyNvVideoCodec SimpleDecoder x14" --only "DALI legacy readers.video x14, 48-frame clips"
    done
    step video_read2_files28 200 "$py" -m benchmarks.video_decode --resolutions 1080p --no-peers --files 28 \
      --work "$CROSSDALI_DATA/video-bench28" --out "$out/read2_files28" --read-rows 3x4,3x2 \
      --only "crossdali loader (PyTorch), 7 pipelines" ;;
  videoread3)  # one clip at a time with 14 pipelines (the read rows' winner; the default for one clip is 7, chosen
    # before 14 was tried) beside 7, and reads of 3 clips with 14, on 28 gop48 files (whole steps for every row),
    # two rounds; then the key-frame interval crossdali's probe reads from those files (the loaders' hint)
    vd=("$py" -m benchmarks.video_decode --resolutions 1080p --no-peers --files 28 --work "$CROSSDALI_DATA/video-bench28")
    for round in 1 2; do
      step video_read3_$round 200 "${vd[@]}" --out "$out/read3_$round" --loader-pipelines 7,14 --read-rows 3x1 \
        --read-pipelines 14 --only "crossdali loader (PyTorch), 7 pipelines" --only "crossdali loader (PyTorch), 14 pipelines"
    done
    step key_frames 60 "$py" -c "import glob; from crossdali.common.video import probe_video
for f in sorted(glob.glob('$CROSSDALI_DATA/video-bench28/*/*'))[:3]: i = probe_video(f); print(f, i.num_frames, i.key_frame_interval)" ;;
  sameday1)  # issue 14 item 4, every benchmark on one day (with classall, trainpipes, trainjax2, videogop16 and the GPU
    # tests of 2026-11-27): detection, a served model, the external-source loaders (Squirrel staged: see formats)
    dmon_step detection_loaders 280 "$py" -m benchmarks.detection_loaders --out "$out/detection"
    dmon_step inference 200 "$py" -m benchmarks.inference --out "$out/inference"
    dmon_step external_source 200 "$py" -m benchmarks.external_source --out "$out/external_source" ;;
  sameday2)  # item 4 continued: WebDataset shards and the multi-label list (LOADER_FORMATS_ARGS=--skip-multilabel: the
    # ImageFolder and WebDataset rows only, as run on 2026-11-27), then the data checker (65,560 files)
    dmon_step loader_formats 400 "$py" -m benchmarks.loader_formats --out "$out/loader_formats" ${LOADER_FORMATS_ARGS:-}
    step bench_set 100 "$py" -m crossdali.common.sample_data --kind classification --size bench --formats imagefolder
    dmon_step check_speed_x8 120 "$py" -m benchmarks.check_speed --size bench --device gpu --copies 8 \
      --out "$out/check_x8" ;;
  sameday3)  # item 4 continued: the whole video table with its GPU peers (PyNvVideoCodec 2.2.4, torchcodec 0.17.0 staged
    # beside DALI; PyAV's FFmpeg libraries on the peers' path), gop48 files, 1080p and 720p. On 2026-11-27 torchcodec
    # did not load (it asks for libavutil.so.61 by soname; PyAV's copies carry hashed names, see classall's links)
    step video_decode 560 env PEER_LD_PATH="${SITE:-/tmp/site}/av.libs" "$py" -m benchmarks.video_decode \
      --out "$out/video" --work "$CROSSDALI_DATA/video-bench" ;;
  multigpu)  # issue 15 on a 2-GPU kind: the PyTorch script under torchrun on 1 then 2 GPUs (DDP, DALI on each rank's
    # own GPU), per-GPU images/s and the val sample count of each run; dmon over every GPU (jpg column per GPU index)
    dmon_step multi_gpu 170 "$py" -m benchmarks.multi_gpu --gpus 1,2 --launchers torchrun --epochs 6 --timeout 120 \
      --out "$out/multi_gpu" ;;
  multigpu2)  # issue 15's 0.855 on a 2-GPU kind: the training script of BASE (the tree before the stop agreement
    # moved a step late: a blocking all-reduce after every step) and of this tree, alternating, 1 and 2 GPUs each,
    # 15 DALI threads per rank in both (ROUNDS: which, default 1); SYNTHETIC=1 adds both trees on synthetic data
    # (DDP without an input pipeline); nvidia-smi topo -m first (how the GPUs are linked)
    base=${BASE:?multigpu2 needs BASE=<the tree before, e.g. git archive 2e9f5b9 crossdali | tar x -C DIR>}
    nvidia-smi topo -m > "$out/topo.txt" 2>&1; cat "$out/topo.txt"
    step bench_set 150 "$py" -c "from crossdali.common.sample_data import ensure_classification as e; print(e(size='bench'))"
    mgpu=("$py" -m benchmarks.multi_gpu --gpus 1,2 --launchers torchrun --epochs 6 --workers 15 --timeout 120)
    for r in ${ROUNDS:-1}; do
      dmon_step mgpu_before_$r 200 "${mgpu[@]}" --tree "$base" --out "$out/before_$r"
      dmon_step mgpu_after_$r 200 "${mgpu[@]}" --out "$out/after_$r"
    done
    if [ -n "${SYNTHETIC:-}" ]; then
      step mgpu_synthetic_before 150 "${mgpu[@]}" --data-backend synthetic --tree "$base" --out "$out/synthetic_before"
      step mgpu_synthetic_after 150 "${mgpu[@]}" --data-backend synthetic --out "$out/synthetic_after"
    fi ;;
  tfsame1)  # item 4, TensorFlow on the day of the others (TF staged, . /tmp/tfenv.sh): TF against PyTorch (dali-gpu,
    # one process; it builds the bench set first); in the call that installs TensorFlow (about 2 min)
    dmon_step tf_vs_torch 230 "$py" -m benchmarks.tf_vs_torch --out "$out/tf_vs_torch" ;;
  tfxla)  # the Keras script on synthetic data with and without XLA (--jit-compile), one run. On 2026-11-27 the XLA row's
    # process ran 180 s (the graph row's 92 s), most of it compiling: a 140 s row limit cut it
    dmon_step training_speed_tf_xla 330 "$py" -m benchmarks.training_speed --framework tensorflow --backends synthetic \
      --variant xla='--jit-compile on' --variant graph='--jit-compile off' --timeout 250 --out "$out/tf_xla" ;;
  tfsame2)  # the Keras script's rows with its default (XLA where one process trains on a GPU): synthetic and dali-gpu
    # (native left out: each XLA row takes about 3 minutes, so three do not fit a call beside the others)
    dmon_step training_speed_tf 450 "$py" -m benchmarks.training_speed --framework tensorflow --backends synthetic,dali-gpu \
      --timeout 280 --out "$out/tf_train" ;;
  tfnative)  # item 4's last row: the Keras script's native row (tf.data + tf.image) with XLA beside synthetic, in the
    # call that installs TensorFlow (about 2 min; the bench set already built by an earlier phase of the lease)
    dmon_step training_speed_tf_native 420 "$py" -m benchmarks.training_speed --framework tensorflow \
      --backends synthetic,native --timeout 200 --out "$out/tf_native" ;;
  tfahead)  # issue 14: the Keras script's batches fetched by a background thread (--fetch-ahead 1) against the loop
    # fetching each after reading the loss, each variant beside its own synthetic row; 5 epochs a row (4 timed). XLA's
    # persistent cache (TF_XLA_FLAGS, measured to work with TF 2.21 on the CPU) lets the second variant's rows reuse
    # the first's compiled step, so four rows fit a call (each compiling one took about 3 minutes on 2026-11-27)
    dmon_step training_speed_tf_ahead 575 env TF_XLA_FLAGS="${TF_XLA_FLAGS:+$TF_XLA_FLAGS }--tf_xla_persistent_cache_directory=/tmp/xla-cache" \
      "$py" -m benchmarks.training_speed --framework tensorflow --backends synthetic,dali-gpu --variant loop='--fetch-ahead 0' \
      --variant ahead='--fetch-ahead 1' --epochs 5 --timeout 280 --out "$out/tf_ahead" ;;
  tfahead2)  # after tfahead on the same machine: both variants again in the reverse order, every row's step loaded from
    # XLA's persistent cache (2026-11-27: the first run's rows that compiled differed from those that loaded the step,
    # synthetic 4,867 against 5,190 images/s, so its shares compare different executables)
    dmon_step training_speed_tf_ahead_cached 560 env TF_XLA_FLAGS="${TF_XLA_FLAGS:+$TF_XLA_FLAGS }--tf_xla_persistent_cache_directory=/tmp/xla-cache" \
      "$py" -m benchmarks.training_speed --framework tensorflow --backends synthetic,dali-gpu \
      --variant ahead='--fetch-ahead 1' --variant loop='--fetch-ahead 0' --epochs 5 --timeout 200 --out "$out/tf_ahead_cached" ;;
  detection)
    step detection_loaders 300 "$py" -m benchmarks.detection_loaders --out "$out" ;;
  decodeprobe)  # which damaged JPEGs each DALI decoder refuses (the data checker's test corpus depends on it)
    step decode_failure_probe 300 "$py" -m benchmarks.decode_failure_probe --out "$out"
    step check_decode_gpu_tests 200 "$py" -m pytest tests/common/test_check_decode.py -m gpu -rA -p no:cacheprovider -q ;;
  tests)  # every GPU-marked test (TensorFlow's and MXNet's skip where those frameworks are absent)
    step gpu_tests 420 "$py" -m pytest tests -m gpu -rA -p no:cacheprovider -q
    step optical_flow 60 "$py" -m crossdali.video.optical_flow --sample-size gpu-tiny --output-dir "$out/flow" ;;
  multigpu4)  # on a 4-GPU kind: the training script on 1, 2 and 4 GPUs under torchrun, 15 DALI threads per rank in
    # every row, 8 epochs (a 4-GPU epoch of the bench set is 8 steps: see steady_img_s); topology first
    nvidia-smi topo -m > "$out/topo.txt" 2>&1; cat "$out/topo.txt"
    step bench_set 150 "$py" -c "from crossdali.common.sample_data import ensure_classification as e; print(e(size='bench'))"
    dmon_step multi_gpu4 420 "$py" -m benchmarks.multi_gpu --gpus 1,2,4 --launchers torchrun --epochs 8 --workers 15 \
      --timeout 130 --out "$out/multi_gpu4" ;;
  ddptests)  # on a 2-GPU kind: the PyTorch training pieces' GPU tests (the stop question queued on the GPU under NCCL)
    # and the graceful stop + resume under torchrun over NCCL, one rank per GPU
    step ddp_gpu_tests 400 "$py" -m pytest tests/pytorch/test_training.py tests/pytorch/test_resume.py -m gpu -rA \
      -p no:cacheprovider -q --durations=8 ;;
  tf)  # TensorFlow dali-gpu: batches on the GPU (classification, detection, video), then parity on the GPU
    step tf_gpu_tests 200 "$py" -m pytest tests/tensorflow/test_tf_gpu.py tests/detection/test_tf_detection.py \
      tests/video/test_tensorflow_video.py -m gpu -rA -p no:cacheprovider -q --durations=12
    step parity_gpu 170 "$py" -m crossdali.parity gpu --out "$out/parity_gpu" ;;
  tfbench)  # the bench set is built by the first step (about a minute on 16 cores). As run on 2026-11-25/26, before the
    # script compiled its step with XLA: its rows now take about 3 minutes each, more than this call holds; run tfsame1,
    # then tfsame2 instead
    step tf_vs_torch 230 "$py" -m benchmarks.tf_vs_torch --out "$out"
    step training_speed_tf 330 "$py" -m benchmarks.training_speed --framework tensorflow --timeout 105 --out "$out" ;;
  core)  # correctness on the GPU first, then the checker's speed (the loader's decode rate beside it)
    step gpu_tests 330 "$py" -m pytest tests -m gpu -rA -p no:cacheprovider -q --durations=15 ;;
  core2)
    step parity_gpu 150 "$py" -m crossdali.parity gpu --out "$out/parity_gpu"
    step check_speed 120 "$py" -m benchmarks.check_speed --size small --device gpu --out "$out" ;;
  check)  # the data checker on the GPU: verdicts equal to the CPU's, then its speed (bench set built first),
    # with DALI's decoder defaults and with every JPEG on the hardware decoder (crossdali's loaders' setting),
    # on the bench set and on 8 symbolic-link copies of it (65,560 files: the decoder build amortised)
    step check_gpu_tests 120 "$py" -m pytest tests/common/test_check_decode.py -m gpu -rA -p no:cacheprovider -q -s
    step bench_set 200 "$py" -m crossdali.common.sample_data --kind classification --size bench --formats imagefolder,webdataset
    step check_speed_bench 240 "$py" -m benchmarks.check_speed --size bench --device gpu --repeats 3 \
      --out "$out/check_bench"
    step check_speed_bench_hw1 90 "$py" -m benchmarks.check_speed --size bench --device gpu --repeats 3 \
      --hw-decoder-load 1 --out "$out/check_bench_hw1"
    step check_speed_x8 150 "$py" -m benchmarks.check_speed --size bench --device gpu --copies 8 --profile \
      --out "$out/check_x8"
    step check_speed_x8_hw1 150 "$py" -m benchmarks.check_speed --size bench --device gpu --copies 8 \
      --hw-decoder-load 1 --out "$out/check_x8_hw1" ;;
  checkdepth)  # the full pass on 65,560 files with 2 and 4 batches in flight
    step check_x8_d2 100 "$py" -m benchmarks.check_speed --size bench --device gpu --copies 8 --out "$out/check_x8_d2"
    step check_x8_d4 100 "$py" -m benchmarks.check_speed --size bench --device gpu --copies 8 --depth 4 \
      --out "$out/check_x8_d4" ;;
  checkprof)  # where the full pass's time goes on 65,560 files: a cProfile of the main thread, the
    # decoder alone beside the whole pass; 4 header processes instead of 8; the CLI's old defaults (-j 4 -b 32)
    step check_gpu_tests 120 "$py" -m pytest tests/common/test_check_decode.py -m gpu -rA -p no:cacheprovider -q
    step bench_set 200 "$py" -m crossdali.common.sample_data --kind classification --size bench --formats imagefolder
    step check_x8_prof 150 "$py" -m benchmarks.check_speed --size bench --device gpu --copies 8 --profile \
      --out "$out/check_x8_prof"
    step check_x8_p4 150 "$py" -m benchmarks.check_speed --size bench --device gpu --copies 8 --processes 4 \
      --out "$out/check_x8_p4"
    step check_x8_j4_b32 150 "$py" -m benchmarks.check_speed --size bench --device gpu --copies 8 -j 4 -b 32 \
      --out "$out/check_x8_j4_b32" ;;
  checkab)  # this tree's checker beside an older one's in the same run, alternating ROUNDS times (default 2), 65,560 files each; BASELINE:
    # a folder holding the older crossdali/ and benchmarks/ (git archive REV crossdali benchmarks | tar x -C DIR)
    base=${BASELINE:?checkab needs BASELINE=DIR}; abs_out=$(cd "$out" && pwd)
    step check_gpu_tests 120 "$py" -m pytest tests/common/test_check_decode.py -m gpu -rA -p no:cacheprovider -q
    step bench_set 200 "$py" -m crossdali.common.sample_data --kind classification --size bench --formats imagefolder
    for run in $(seq "${ROUNDS:-2}"); do
      step "check_x8_base_$run" 150 bash -c "cd '$base' && PYTHONPATH=\$PWD:\$PYTHONPATH '$py' -m benchmarks.check_speed \
        --size bench --device gpu --copies 8 --out '$abs_out/check_x8_base_$run'"
      step "check_x8_new_$run" 150 "$py" -m benchmarks.check_speed --size bench --device gpu --copies 8 \
        --out "$out/check_x8_new_$run"
    done ;;
  checkahead)  # the full pass on 65,560 files with headers read at most 8,192 (default) or 65,536 files ahead, alternating
    step bench_set 200 "$py" -m crossdali.common.sample_data --kind classification --size bench --formats imagefolder
    for run in 1 2; do
      for ahead in 8192 65536; do
        step "check_x8_ahead${ahead}_$run" 150 "$py" -m benchmarks.check_speed --size bench --device gpu --copies 8 \
          --read-ahead "$ahead" --out "$out/check_x8_ahead${ahead}_$run"
      done
    done ;;
  formats)  # issue 13's loaders on the GPU: the external-source loaders' GPU tests (PyTorch, JAX), then a
    # Squirrel store through external_source as a stream and as shards (against Squirrel's own PyTorch path);
    # needs squirrel-core staged (../shared/gpu/stage-dali squirrel-core==0.20.2 msgpack msgpack-numpy more-itertools tqdm)
    step external_gpu_tests 120 "$py" -m pytest tests/pytorch/test_external_gpu.py tests/jax/test_jax_gpu.py -m gpu \
      -rA -p no:cacheprovider -q --durations=8
    step external_source 400 "$py" -m benchmarks.external_source --out "$out" ;;
  lists)  # WebDataset shards and a multi-label list (against torchvision's DataLoader): 280 s was too short
    # on 2026-11-26 (cut short in the torchvision multi-label row). LOADER_FORMATS_ARGS=--skip-multilabel:
    # the ImageFolder and WebDataset rows only
    # (dmon beside it since 2026-11-27, whose multi-label run through this phase recorded none)
    dmon_step loader_formats 540 "$py" -m benchmarks.loader_formats --out "$out" ${LOADER_FORMATS_ARGS:-} ;;
  inference)  # a served model: batch-1 latency and batch-64 throughput, DALI GPU against PIL + torchvision
    step inference 420 "$py" -m benchmarks.inference --out "$out" ;;
  pack)
    tar czf "/tmp/gpu-results.tgz" -C "$out" . && mv /tmp/gpu-results.tgz "$out/" && ls -la "$out/gpu-results.tgz" ;;
  *)
    echo "unknown phase $phase (classification, classpeers, video, videoprof, videox264, detection, tests, tf, tfbench, core, core2, check, checkdepth, checkprof, checkab, checkahead, formats, lists, inference or pack)" >&2; exit 2 ;;
esac
