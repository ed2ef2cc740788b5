#!/usr/bin/env bash
# Set up (idempotent, cached) and run the whole test suite: unit, real SGLang objects on CPU,
# and end-to-end against real sglang.launch_server processes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
export SGLANG_USE_CPU_ENGINE=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# style first (seconds): pyflakes, import order, bugbear, formatting (config in pyproject.toml)
.venv/bin/ruff check sglang_continuum lab tests cpushim
.venv/bin/ruff format --check sglang_continuum lab tests cpushim
# A whole-suite limit well inside CI's: a process that hangs (after its summary, say) ends with every
# thread's stack printed (faulthandler on SIGABRT) instead of running out CI's clock in silence.
exec timeout --signal=ABRT --kill-after=60 "${CONTINUUM_SUITE_LIMIT_S:-2700}" \
  .venv/bin/python -X faulthandler -m pytest -p no:cacheprovider -q "$@"
