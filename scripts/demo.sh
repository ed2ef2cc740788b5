#!/usr/bin/env bash
# The main job: set up (idempotent, cached), then compare fcfs / lpm / continuum on the CPU
# SWE-bench-like workload under KV pressure, over 3 seeds, interleaved, and print the headline
# (median ratio vs fcfs and vs the best stock policy, worst seed, collapsed runs). About 10 minutes
# on 2 cores. Pass more flags to continuum-bench after the command (e.g. --seeds 1,2,3,4,5).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
export SGLANG_USE_CPU_ENGINE=1
exec .venv/bin/continuum-bench --workload workloads/swe-cpu-prefill.jsonl --model .models/tiny-llama \
  --policies fcfs,lpm,continuum --jps 1 --pool-programs 3 --programs 8 --seeds 1,2,3 --out out/demo "$@"
