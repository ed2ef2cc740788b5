#!/usr/bin/env bash
# The main job: set up (idempotent, cached), then compare fcfs / lpm (SGLang's stock policies) with
# continuum over 3 seeds, interleaved, in two parts that say what they are:
#   1. PREDICTED at GPU scale: the emulator (SGLang 0.5.23's real scheduler and this plugin in
#      virtual time, H100 + Llama-3.1-8B step latencies), 120 SWE-bench-like programs at 0.1
#      programs/s, where the KV pool is contended;
#   2. MEASURED on this machine: real SGLang servers on CPU with the embedded tiny model, fcfs vs
#      continuum, 12 programs of the prefill-heavy SWE-like workload, a KV pool of ~3 program
#      contexts (lpm is left to part 1: each real run costs ~35 s of server start-up on 2 cores).
# Then it prints a summary (ratios, spread, worst seed, pins, where the plots are). About 10-12
# minutes on 2 cores. DEMO_OUT=dir to write elsewhere (default out/demo).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
export SGLANG_USE_CPU_ENGINE=1
OUT="${DEMO_OUT:-out/demo}"
mkdir -p "$OUT"
PY=.venv/bin/python
BENCH=.venv/bin/continuum-bench

echo "[demo] part 1/2: PREDICTED at GPU scale (emulated H100 + Llama-3.1-8B, not measured)"
$PY -m continuum_lab.workloads.generate swe --programs 500 --seed 0 --max-context 131000 --out "$OUT/swe-500.jsonl" >/dev/null
$BENCH --emulate configs/profiles/h100-sglang-llama-3.1-8b.json --workload "$OUT/swe-500.jsonl" --programs 120 \
  --jps 0.1 --seeds 1,2,3 --policies fcfs,lpm,continuum --jobs 2 --summary-only --out "$OUT/emulated"

echo "[demo] part 2/2: MEASURED on this machine (real SGLang servers on CPU, tiny model)"
$BENCH --workload workloads/swe-cpu-prefill.jsonl --model .models/tiny-llama --policies fcfs,continuum \
  --jps 1 --pool-programs 3 --programs 12 --seeds 1,2,3 --out "$OUT/measured"

$PY -m continuum_lab.cli.demo "$OUT"
