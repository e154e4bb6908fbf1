#!/usr/bin/env bash
# The GPU run of issue 31 item 5, as one script with a deadline per part: what a machine lent
# through `device` ran (README "On a GPU"). Never needed by the tests.
#
#   OUT=/tmp/gpu bash bench/gpu.sh          # on a machine with a CUDA GPU, from the repository root
#
# It writes to $OUT:
#   log.txt                  everything it printed;
#   rollouts.tar             the honest rollouts of bench/calibrate.py --produce (tiny and base,
#                            both halves, bfloat16, every producer variation; and 16 a half of
#                            qwen2.5-0.5b), for the CPU verifier here:
#                              tar -xf rollouts.tar -C /tmp/cuda-rollouts
#                              python bench/calibrate.py --dtypes bfloat16 --attention sdpa \
#                                --producer-rollouts /tmp/cuda-rollouts --producer-device cuda \
#                                --out bench/results/calibrate-cuda-sdpa.json      (then eager, then --add-from)
#   qwen0.5b-cuda.json       bench/scale_model.py on the GPU (bf16, sdpa);
#   calibrate-cuda-same.json the profile cuda/bfloat16/sdpa/same, calibrated on the GPU alone
#                            (its producer and verifier), if time is left.
# On an H200 (2026-11-27) the halves took 148 s (the 0.5B preset's two builds included) and the
# 0.5B parts 168 s before their deadline cut verify:8 and everything after it, which a second
# call ran (README "The 0.5B shape on a GPU"); the last part was never reached. With 15 minutes
# of device time, give it a call of its own.
# A lent machine has no network: .gpu/ (ignored by git, carried) may hold overlay/ (files to
# copy over the tree), whl/ (wheels, installed into /tmp/site) and cache/ (VRL_DATA_DIR: the
# trained base model, whose bits another torch would not reproduce).
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
ROOT=$(pwd)
START=$(date +%s)
BUDGET=${BUDGET:-430}  # seconds for the whole script: the device tool's call limit, less headroom
# A dry run here: DEVICE=cpu ROLLOUTS=16 CHECK_MODEL=qwen2.5-0.5b-2layer BUDGET=3000 \
#   SCALE_ARGS="--model qwen2.5-0.5b-2layer --new-tokens 4 --only load,generate:1,verify:8,grpo:adamw@2,replay@2"
DEVICE=${DEVICE:-cuda}
ROLLOUTS=${ROLLOUTS:-192}  # 192 of tiny and 8 x 192 of base a half: 5,184 verdicts under 3 verifier variations
CHECK_MODEL=${CHECK_MODEL:-qwen2.5-0.5b}
SCALE_ARGS=${SCALE_ARGS:-}
left() { echo $((BUDGET - ($(date +%s) - START))); }
exec > >(tee -a "$OUT/log.txt") 2>&1

if [ -d .gpu/overlay ]; then cp -r .gpu/overlay/. .; fi
export PYTHONPATH=$ROOT
if [ -d .gpu/whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .gpu/whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$ROOT
fi
if [ -d .gpu/cache ]; then export VRL_DATA_DIR=$ROOT/.gpu/cache; fi
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore TOKENIZERS_PARALLELISM=false

echo "== versions ($(left) s left)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "
import torch, transformers, vrl.rollouts.generate, vrl.rollouts.verify, vrl.rl.step
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__,
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU',
      'cpu', torch.backends.cpu.get_cpu_capability(), 'cpus', __import__('os').cpu_count())" || exit 1

echo "== calibration halves on the GPU ($(left) s left)"
rm -rf /tmp/cal && timeout ${PRODUCE_S:-170} python3 bench/calibrate.py --device "$DEVICE" --dtypes bfloat16 --models tiny base \
    --rollouts "$ROLLOUTS" --check-models "$CHECK_MODEL" --check-rollouts 16 --produce /tmp/cal
cat /tmp/cal/produced.json
tar -C /tmp/cal -cf "$OUT/rollouts.tar" .

echo "== the 0.5B shape's costs ($(left) s left)"
timeout $(( $(left) - 90 )) python3 bench/scale_model.py --device "$DEVICE" --dtype bfloat16 --attention sdpa \
    --weights-cache /tmp/scale-weights-$START --out "$OUT/qwen0.5b-cuda.json" $SCALE_ARGS

echo "== cuda/bfloat16/sdpa/same ($(left) s left)"
timeout $(( $(left) - 10 )) python3 bench/calibrate.py --device "$DEVICE" --dtypes bfloat16 --attention sdpa \
    --models tiny base --producer-rollouts /tmp/cal --producer-device cuda --check-models "$CHECK_MODEL" \
    --check-limit 4 --out "$OUT/calibrate-cuda-same.json"
echo "== done ($(left) s left)"
