#!/usr/bin/env bash
# Set up (idempotent, cached) and run the whole test suite: unit, real SGLang objects on CPU,
# and end-to-end against real sglang.launch_server processes. With arguments: pytest with them.
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
pytest() {
  timeout --signal=ABRT --kill-after=60 "${CONTINUUM_SUITE_LIMIT_S:-2700}" \
    .venv/bin/python -X faulthandler -m pytest -p no:cacheprovider -q "$@"
}
if [ "$#" -gt 0 ]; then
  pytest "$@"
  exit
fi
# The end-to-end tier runs beside the other two: its servers spend much of their wall time waiting
# (start-up, tool gaps, pins running out), which the in-process tiers fill. Its output follows theirs.
E2E_LOG="$(mktemp)"
trap 'rm -f "$E2E_LOG"' EXIT
# the fleet tests start servers of their own: they even out the two halves' wall time
BESIDE=tests/e2e/test_fleet.py
pytest tests/e2e --ignore="$BESIDE" > "$E2E_LOG" 2>&1 &
E2E=$!
status=0
pytest tests/unit tests/lab tests/sglang "$BESIDE" || status=$?
e2e_status=0
wait "$E2E" || e2e_status=$?
echo "[test] end-to-end tier (tests/e2e but $BESIDE):"
cat "$E2E_LOG"
echo "[test] unit, lab and SGLang tiers and $BESIDE: exit $status; the rest of the end-to-end tier: exit $e2e_status"
[ "$status" -eq 0 ] && [ "$e2e_status" -eq 0 ]
