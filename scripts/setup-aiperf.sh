#!/usr/bin/env bash
# Idempotent set-up of .venv-aiperf/: NVIDIA's AIPerf (the field's serving benchmark) in a venv of
# its own, for `continuum-aiperf` (lab/continuum_lab/cli/aiperf_grid.py, docs/results/aiperf/).
#
# Its own venv because AIPerf needs Python >= 3.11 and pins a large dependency tree (pydantic,
# zmq, aiohttp, transformers, plotting, ...) that must not move the pinned SGLang stack in .venv/.
# The lab never imports it: it runs `.venv-aiperf/bin/aiperf` as a subprocess. Installed with the
# uv of .venv/ (scripts/setup.sh puts it there); a stamp keyed on this script makes a second run a
# no-op. Ignored by git (.gitignore). `AIPERF_VERSION=... bash scripts/setup-aiperf.sh` tries
# another release (the lab is written against 0.13.0's flags and export files).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv-aiperf"
VERSION="${AIPERF_VERSION:-0.13.0}"
STAMP="$VENV/.aiperf-setup-stamp"
UV="${UV:-$ROOT/.venv/bin/uv}"

want=$( (cat scripts/setup-aiperf.sh; echo "$VERSION") | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/aiperf" ]; then
  echo "[setup-aiperf] up to date ($VENV, aiperf $VERSION)"
  exit 0
fi
if [ ! -x "$UV" ]; then
  UV="$(command -v uv || true)"
  [ -n "$UV" ] || { echo "[setup-aiperf] FAILED: no uv (run scripts/setup.sh first, or pip install uv)" >&2; exit 1; }
fi
t0=$(date +%s)
rm -f "$STAMP"  # stamped again only once everything below succeeded
# Python 3.11: AIPerf 0.13.0 requires >= 3.11 (uv finds an interpreter of that version here, or
# fetches none: it fails with its own message where there is none)
[ -x "$VENV/bin/python" ] || "$UV" venv -q --python 3.11 "$VENV"
# bytecode compiled at install: this machine's Python never writes .pyc itself
# (PYTHONDONTWRITEBYTECODE), and AIPerf starts ~10 service processes per run, each importing it
if ! "$UV" pip install -q --python "$VENV/bin/python" --compile-bytecode "aiperf==$VERSION"; then
  echo "[setup-aiperf] FAILED: uv pip install aiperf==$VERSION (its output above); nothing was stamped" >&2
  exit 1
fi
"$VENV/bin/aiperf" --version >/dev/null 2>&1 || "$VENV/bin/python" -c "import aiperf" \
  || { echo "[setup-aiperf] FAILED: aiperf does not import; nothing was stamped" >&2; exit 1; }
echo "$want" > "$STAMP"
echo "[setup-aiperf] aiperf $VERSION installed in $VENV in $(( $(date +%s) - t0 ))s"
