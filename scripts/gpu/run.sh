#!/usr/bin/env bash
# On the lent GPU machine (no network, torch 2.11, no sglang): install the bundle that
# `continuum-gpu build` wrote (.gpu-bundle/, carried with the tree), check the imports, start
# SGLang 0.5.23 with this plugin and without sgl_kernel on the config-only Llama-3.1-8B, send the
# smoke requests, then compare fcfs / lpm / continuum with continuum-bench. docs/gpu.md.
#
#   bash scripts/gpu/run.sh [all|smoke|bench]        (default all; OUT=dir keeps logs and reports)
#
# Settings (environment): BUNDLE (.gpu-bundle), SITE (/tmp/continuum-gpu-site), OUT (/tmp/continuum-gpu),
# PORT (30000), POLICIES (fcfs,lpm,continuum), JPS (0.25), SEEDS (1), BENCH_TIMEOUT_S (480),
# MAX_TOTAL_TOKENS (smoke server pool, 200000), BENCH_ARGS (more continuum-bench flags),
# SKIP_IMPORT_CHECK (set: skip continuum-gpu check-imports).
set -euo pipefail
STAGE="${1:-all}"
case "$STAGE" in all | smoke | bench) ;; *) echo "usage: $0 [all|smoke|bench]" >&2; exit 2 ;; esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
BUNDLE="$(realpath "${BUNDLE:-.gpu-bundle}")"
SITE="${SITE:-/tmp/continuum-gpu-site}"
OUT="${OUT:-/tmp/continuum-gpu}"
PORT="${PORT:-30000}"
POLICIES="${POLICIES:-fcfs,lpm,continuum}"
JPS="${JPS:-0.25}"
SEEDS="${SEEDS:-1}"
BENCH_TIMEOUT_S="${BENCH_TIMEOUT_S:-480}"
MAX_TOTAL_TOKENS="${MAX_TOTAL_TOKENS:-200000}"
MODEL="$BUNDLE/models/llama-3.1-8b-shape"
WORKLOAD="$BUNDLE/workloads/swe-gpu.jsonl"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
[ -f "$BUNDLE/manifest.json" ] || { echo "no $BUNDLE/manifest.json: run continuum-gpu build here first and carry .gpu-bundle" >&2; exit 3; }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

echo "== machine"
nvidia-smi -L || true
ldd --version | sed -n 1p  # glibc >= 2.34 for the manylinux_2_34 sglang wheel (sed: no SIGPIPE)
"$PY" --version

echo "== install $(ls "$BUNDLE"/wheels/*.whl | wc -l) wheels into $SITE"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$BUNDLE"/wheels/*.whl
# the bundle's packages first (typing_extensions newer than the image's), the sgl_kernel
# placeholder, this package's entry point, then the tree itself
export PYTHONPATH="$SITE:$ROOT/gpushim:$BUNDLE/plugin:$ROOT:$ROOT/lab${PYTHONPATH:+:$PYTHONPATH}"
# sglang's radix tree core links torch's libraries through a RUNPATH that assumes torch sits beside it
TORCH_LIB="$("$PY" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
export LD_LIBRARY_PATH="$TORCH_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# GPU_SHIM_ENV exported, GPU_SHIM_FLAGS set (lab/continuum_lab/harness/server.py)
eval "$("$PY" -m continuum_lab.cli.gpu_bundle env)"
env | grep -E '^SGLANG_' | sort

if [ -z "${SKIP_IMPORT_CHECK:-}" ]; then
  echo "== import check"
  "$PY" -m continuum_lab.cli.gpu_bundle check-imports 2>&1 | tee "$OUT/check-imports.log"
fi

if [ "$STAGE" != bench ]; then
  echo "== smoke: one server, --schedule-policy continuum, log $OUT/server-smoke.log"
  # shellcheck disable=SC2086  # GPU_SHIM_FLAGS is a list of flags
  "$PY" -m sglang.launch_server --model-path "$MODEL" --host 127.0.0.1 --port "$PORT" $GPU_SHIM_FLAGS \
    --schedule-policy continuum --enable-metrics --enable-cache-report \
    --max-total-tokens "$MAX_TOTAL_TOKENS" --context-length 32768 > "$OUT/server-smoke.log" 2>&1 &
  SERVER_PID=$!
  trap 'kill $SERVER_PID 2>/dev/null || true' EXIT
  set +e
  "$PY" -m continuum_lab.cli.gpu_bundle smoke --url "http://127.0.0.1:$PORT" --wait-s 420 \
    --server-pid "$SERVER_PID" --out "$OUT/smoke.json"
  SMOKE_RC=$?
  if [ "$SMOKE_RC" = 0 ]; then
    echo "== step times against the emulator's profiles"
    "$PY" -m continuum_lab.cli.gpu_bundle steps --url "http://127.0.0.1:$PORT" --out "$OUT/steps.json" \
      --profile configs/profiles/h100-sglang-llama-3.1-8b.json --profile configs/profiles/h100-sglang-shim-llama-3.1-8b.json
  fi
  set -e
  "$PY" - "$PORT" > "$OUT/metrics-smoke.txt" <<'EOF' || true
import sys, httpx
print(httpx.get(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).text)
EOF
  grep -E '^sglang:continuum_' "$OUT/metrics-smoke.txt" | head -20 || true
  kill "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
  trap - EXIT
  if [ "$SMOKE_RC" != 0 ]; then
    echo "smoke failed (rc $SMOKE_RC); the server log's end:" >&2
    tail -60 "$OUT/server-smoke.log" >&2
    exit 4
  fi
fi

if [ "$STAGE" != smoke ]; then
  echo "== bench: $POLICIES @ $JPS jps, seeds $SEEDS, report in $OUT/bench"
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
  timeout "$BENCH_TIMEOUT_S" "$PY" -m continuum_lab.cli.bench --gpu shim --model "$MODEL" \
    --workload "$WORKLOAD" --policies "$POLICIES" --jps "$JPS" --seeds "$SEEDS" --no-pin-cpus \
    --prefill-profile configs/profiles/h100-sglang-shim-llama-3.1-8b.json --out "$OUT/bench" ${BENCH_ARGS:-}
fi
