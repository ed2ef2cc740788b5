#!/usr/bin/env bash
# The main job: set up (idempotent, cached), then compare fcfs / lpm (SGLang's stock policies) with
# continuum over seeds, interleaved, in two parts that say what they are:
#   1. PREDICTED at GPU scale: the emulator (SGLang 0.5.23's real scheduler and this plugin in
#      virtual time, H100 + Llama-3.1-8B step latencies), 48 SWE-bench-like programs at 0.1
#      programs/s, where the KV pool is contended; 3 seeds;
#   2. MEASURED on this machine: real SGLang servers on CPU with the embedded tiny model, fcfs, lpm
#      and continuum, 30 programs of the prefill-heavy SWE-like workload (its small variant: two
#      thirds of the tokens, half the tool time) on a KV pool of ~6 program contexts, where fcfs
#      and lpm fall into the re-prefill spiral (docs/results/thrash-cpu/); 2 seeds (each real run
#      costs ~25 s of server start-up and ~35-60 s of replay). The load is set from this machine's
#      speed, measured on the first server before its run (--jps auto, lab/continuum_lab/bench/calibrate.py):
#      programs arrive at 4.5x the rate it can prefill them with nothing cached, and each program's
#      tools take 1.7x its no-cache prefill time, so every machine is offered the same pressure (a
#      rate fixed in programs/s spirals on one machine and idles on one twice as fast). The chosen
#      rate and why head its report and the summary.
# Then it prints a summary (ratios, spread, worst seed, pins, where the plots are). About 9-11 minutes
# on 2 cores once set up. DEMO_OUT=dir to write elsewhere (default out/demo); DEMO_JPS=N fixes the
# measured part's rate instead (programs/s, tool times as recorded).
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
if [ -n "${DEMO_JPS:-}" ]; then LOAD=(--jps "$DEMO_JPS"); else LOAD=(--jps auto --load 4.5 --tool-ratio 1.7); fi
$BENCH --workload workloads/swe-cpu-prefill-72-small.jsonl --model .models/tiny-llama --policies fcfs,lpm,continuum \
  "${LOAD[@]}" --pool-programs 6 --programs 30 --seeds 1,2 --out "$OUT/measured"

$PY -m continuum_lab.cli.demo "$OUT"
