#!/usr/bin/env bash
# The main job: set up (idempotent, cached), then replay the CPU SWE-bench-like workload against
# one SGLang server per policy and print the comparison table. About 7 minutes on 2 cores.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
export SGLANG_USE_CPU_ENGINE=1
exec .venv/bin/continuum-bench --workload workloads/swe-cpu.jsonl --model .models/tiny-llama \
  --policies fcfs,lpm,continuum-ref,continuum --jps 2 --pool-programs 2 --out out/demo "$@"
