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
# The end-to-end tier runs beside the other two, itself in two processes: its servers spend much of
# their wall time waiting (start-up, tool gaps, pins running out, probes' windows), which the others
# fill. One process has the tests of the session's shared continuum server (tests/e2e/conftest.py:
# one start-up for all of them), the other the files whose servers are their own (OWN below; a new
# file goes with the shared server unless listed). Their output follows the in-process tiers'.
OWN=(tests/e2e/test_reliability.py tests/e2e/test_fleet.py tests/e2e/test_agents.py
  tests/e2e/test_bench_serving.py tests/e2e/test_program_scope.py)
SHARED_LOG="$(mktemp)" OWN_LOG="$(mktemp)"
trap 'rm -f "$SHARED_LOG" "$OWN_LOG"' EXIT
pytest tests/e2e "${OWN[@]/#/--ignore=}" > "$SHARED_LOG" 2>&1 &
SHARED=$!
pytest "${OWN[@]}" > "$OWN_LOG" 2>&1 &
OWNED=$!
status=0
pytest tests/unit tests/lab tests/sglang || status=$?
shared_status=0 own_status=0
wait "$SHARED" || shared_status=$?
wait "$OWNED" || own_status=$?
echo "[test] end-to-end tier, the shared server's half (tests/e2e but ${OWN[*]}):"
cat "$SHARED_LOG"
echo "[test] end-to-end tier, the files with servers of their own (${OWN[*]}):"
cat "$OWN_LOG"
echo "[test] unit, lab and SGLang tiers: exit $status; end-to-end, shared server: exit $shared_status;" \
  "end-to-end, own servers: exit $own_status"
[ "$status" -eq 0 ] && [ "$shared_status" -eq 0 ] && [ "$own_status" -eq 0 ]
