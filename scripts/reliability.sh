#!/usr/bin/env bash
# Issue 14's reliability suite against live CPU servers (one at a time, 127.0.0.1 only): bad
# metadata, out-of-vocabulary ids, /flush_cache with live pins, abort storms, SIGKILL restarts, bad
# stats paths and contents, many program ids, pressure (fcfs vs continuum), chaos (overload with
# clients that give up, retractions, queue-limit rejections, under strict checks). Writes
# docs/results/reliability/report.{json,md}; arguments go to the suite (--probes a,b --quick
# --out DIR --merge ...; see --help).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
export SGLANG_USE_CPU_ENGINE=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export CONTINUUM_RELIABILITY_COMMAND="bash scripts/reliability.sh${*:+ $*}"
exec .venv/bin/python -m continuum_lab.cli.reliability --out docs/results/reliability "$@"
