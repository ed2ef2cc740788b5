#!/usr/bin/env bash
# Set up (idempotent, cached) and run the whole test suite: unit, real SGLang objects on CPU,
# and end-to-end against real sglang.launch_server processes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
export SGLANG_USE_CPU_ENGINE=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec .venv/bin/python -m pytest -p no:cacheprovider -q "$@"
