#!/usr/bin/env bash
# Issue 30's simulations at N = 1,000 on a machine with many cores (a machine lent through
# `device` has 16), one simulation a core, each under a CPU limit; what this 2-core machine
# cannot run in a session (about 150-200 CPU s a round at N = 1,000 with batches of a whole
# round). The simulator's counts (checks, bytes, quarantines) do not depend on the machine;
# its cpu_seconds do. Never needed by the tests.
#
#   OUT=/tmp/wide bash bench/simulate_wide.sh      # from the repository root
#
# Writes to $OUT: scale-1000.json (bench/simulate.py --json, committee design, batches of
# $BATCH), adversaries-1000-<family>.json (bench/simulate_adversaries.py, one family at
# 10%, 30% and 45%), log.txt. A lent machine has no network: .whl/ (ignored by git, carried)
# holds the wheels of what its image lacks, installed into /tmp/site. Fill it here first, at
# the versions this checkout's environment has (its Python may differ from the device's 3.12):
#
#   bash bench/simulate_wide.sh wheels
set -u
# What the simulator imports that the lent image (device KINDS.md's package list) lacks.
WHEELS="async_generator base58 blake3 cffi cryptography dill dnspython mmh3 morphys multiaddr netaddr outcome
 py_cid py_multibase py_multicodec py_multihash pycparser pynacl python_baseconv sniffio structlog tomli_w trio
 trio_typing varint zstandard"
if [ "${1:-}" = wheels ]; then
    mkdir -p .whl
    for name in $WHEELS; do
        spec=$(python -c "import importlib.metadata as m, sys; print(f'{sys.argv[1]}=={m.version(sys.argv[1])}')" "$name")
        python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$spec" 2>/dev/null \
            || python -m pip wheel -q --no-deps -w .whl "$spec" || exit 1  # a pure-Python sdist
    done
    exit 0
fi
OUT=${OUT:-/tmp/wide-out}
mkdir -p "$OUT"
ROOT=$(pwd)
LIMIT=${LIMIT:-480}        # CPU seconds a simulation: the device tool's 600 s call, less start-up and headroom
NODES=${NODES:-1000}
# Groups a step trains on: 'round' (every worker's groups, ~170 CPU s a round at N = 1,000 here,
# so about 3 rounds fit one call) or a number (the daemon's default, 12: 20 rounds of N = 1,000
# in ~150 CPU s, rounds of a few seconds in which a verifier checks a few groups).
BATCH=${BATCH:-round}
FAMILIES=${FAMILIES:-content fabricated-reward collude lazy withhold}
exec > >(tee -a "$OUT/log.txt") 2>&1

export PYTHONPATH=$ROOT PYTHONHASHSEED=0 PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$ROOT
fi
python3 -c "import os, platform; print(platform.processor() or platform.machine(), os.cpu_count(), 'cores')"
python3 -c "import vrl.harness.simulator.driver" || exit 1

python3 bench/simulate.py --nodes "$NODES" --warmup 3 --rounds 20 --design committee --batch-groups "$BATCH" \
    --cpu-limit "$LIMIT" --json >"$OUT/scale-$NODES.json" 2>"$OUT/scale-$NODES.err" &
pids=($!)
for family in $FAMILIES; do
    # three shares a family, one process each
    python3 bench/simulate_adversaries.py --nodes "$NODES" --warmup 1 --rounds 12 --families "$family" \
        --batch-groups "$BATCH" --jobs 3 --cpu-limit "$LIMIT" --out "$OUT/adversaries-$NODES-$family.json" \
        >"$OUT/adversaries-$NODES-$family.log" 2>&1 &
    pids+=($!)
done
wait "${pids[@]}"  # these only: a bare wait would also wait for the tee above, which never ends
ls -la "$OUT"
