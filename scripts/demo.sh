#!/usr/bin/env bash
# The main job: set up (idempotent, cached), then compare fcfs / lpm (SGLang's stock policies) with
# continuum over seeds, interleaved, in two parts that say what they are:
#   1. PREDICTED at GPU scale: the emulator (SGLang 0.5.23's real scheduler and this plugin in
#      virtual time, H100 + Llama-3.1-8B step latencies), 48 SWE-bench-like programs at 0.1
#      programs/s, where the KV pool is contended; 3 seeds;
#   2. MEASURED on this machine: real SGLang servers on CPU with the embedded tiny model, fcfs, lpm
#      and continuum, 30 programs of the prefill-heavy SWE-like workload (its small variant: two
#      thirds of the tokens, half the tool time) arriving at 5/s on a KV pool of ~6 program
#      contexts, where fcfs and lpm fall into the re-prefill spiral (docs/results/thrash-cpu/);
#      2 seeds (each real run costs ~25 s of server start-up and ~35-45 s of replay).
# Then it prints a summary (ratios, spread, worst seed, pins, where the plots are). About 9-10 minutes
# on 2 cores once set up. DEMO_OUT=dir to write elsewhere (default out/demo).
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
$BENCH --emulate configs/profiles/h100-sglang-llama-3.1-8b.json --workload "$OUT/swe-500.jsonl" --programs 48 \
  --jps 0.1 --seeds 1,2,3 --policies fcfs,lpm,continuum --jobs 2 --summary-only --out "$OUT/emulated"

echo "[demo] part 2/2: MEASURED on this machine (real SGLang servers on CPU, tiny model)"
$BENCH --workload workloads/swe-cpu-prefill-72-small.jsonl --model .models/tiny-llama --policies fcfs,lpm,continuum \
  --jps 5 --pool-programs 6 --programs 30 --seeds 1,2 --out "$OUT/measured"

$PY -m continuum_lab.cli.demo "$OUT"
