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
exec .venv/bin/python -m pytest -p no:cacheprovider -q "$@"
