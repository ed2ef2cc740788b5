#!/usr/bin/env bash
# Paper-scale evidence without a GPU (issue 10): SGLang 0.5.23's scheduler, radix cache and the
# plugin in virtual time on an H100 + Llama-3.1-8B step profile built from measured per-op data.
# Every time in these reports is PREDICTED by the emulator, not measured on a GPU.
#
#   bash scripts/paper_scale.sh [OUT]     (default docs/results/paper-scale; ~2.5 hours on 2 cores)
#   EXTRA=1 bash scripts/paper_scale.sh   also BFCL and turn repeats 3-5 (not in the committed report)
# The committed reports ran the emulator's serial loop; today it runs SGLang's overlap loop, as a
# server does (lab/continuum_lab/emulator/README.md), so a re-run gives the overlap figures.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
PY=.venv/bin/python
OUT=${1:-docs/results/paper-scale}
PROFILE=configs/profiles/h100-sglang-llama-3.1-8b.json
WL=$(mktemp -d)
trap 'rm -rf "$WL"' EXIT
# the paper's Table 1 statistics (workloads/generate.py), 500 programs; xK: turns repeated K times, tokens / K
for k in 1 2 3 4 5; do
  $PY -m continuum_lab.workloads.generate swe --programs 500 --seed 0 --turn-repeat "$k" --out "$WL/swe-500-x$k.jsonl" >/dev/null
done
$PY -m continuum_lab.workloads.generate bfcl --programs 500 --seed 0 --out "$WL/bfcl-500.jsonl" >/dev/null

bench() { $PY -m continuum_lab.cli.bench --emulate "$PROFILE" --jobs 2 --summary-only "$@"; }
KNEE=0.07
MAIN=fcfs,lpm,continuum,continuum-no-wait-bound

# isolated JCT: programs far apart (one at a time); isolated.json is a summary of this run
$PY -m continuum_lab.emulator.run --workload "$WL/swe-500-x1.jsonl" --policy fcfs --profile "$PROFILE" \
  --jps 0.001 --seed 1 --programs 40 --max-total-tokens 454188 --out "$WL/isolated-run.json"
# load sweep: below the knee, at it, past it
bench --workload "$WL/swe-500-x1.jsonl" --policies fcfs,continuum,continuum-no-wait-bound --jps 0.05,0.07,0.1 \
  --seeds 1 --out "$OUT/swe-load-sweep"
# every policy and both ablations at the knee
bench --workload "$WL/swe-500-x1.jsonl" --jps $KNEE --seeds 1 \
  --policies fcfs,lpm,tlru,session,continuum-ref,continuum,continuum-order-only,continuum-pins-only,continuum-no-wait-bound \
  --out "$OUT/swe-knee"
# the main comparison over 3 seeds at the knee
bench --workload "$WL/swe-500-x1.jsonl" --jps $KNEE --seeds 1,2,3 --policies $MAIN --out "$OUT/swe-knee-seeds"
# the turn-count experiment (the paper's figure): turns x2, tokens / 2
bench --workload "$WL/swe-500-x2.jsonl" --jps $KNEE --seeds 1 --policies $MAIN --out "$OUT/swe-turns-x2"
if [ "${EXTRA:-0}" = 1 ]; then
  for k in 3 4 5; do
    bench --workload "$WL/swe-500-x$k.jsonl" --jps $KNEE --seeds 1 --policies $MAIN --out "$OUT/swe-turns-x$k"
  done
  # BFCL: 110 of 500 programs exceed Llama-3.1's 131,072-token context (SGLang aborts those turns)
  bench --workload "$WL/bfcl-500.jsonl" --jps 0.05 --seeds 1 --policies $MAIN --out "$OUT/bfcl"
fi
rm -rf "$OUT"/*/runs  # per-run JSON with every turn: large; report.json keeps the summaries
