#!/usr/bin/env bash
# Idempotent set-up of a CPU environment with real SGLang 0.5.23 and sglang-continuum.
# Creates .venv/ under the repo (ignored by git), installs pinned deps, installs this package in
# editable mode, installs the CPU shim (see README "CPU shim"), and builds the embedded tiny model.
# A stamp file keyed on the inputs makes a second run a no-op.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
STAMP="$VENV/.continuum-setup-stamp"

want=$(cat scripts/setup.sh requirements/*.txt pyproject.toml cpushim/*.py 2>/dev/null | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
  echo "[setup] environment up to date ($VENV)"
else
  t0=$(date +%s)
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
  # torch first, from the CPU build (a plain resolve would pull CUDA torch and ~5 GB of nvidia wheels).
  "${PIP[@]}" -c requirements/cpu-constraints.txt torch==2.13.0
  "${PIP[@]}" -c requirements/cpu-constraints.txt --no-deps sglang==0.5.23
  "${PIP[@]}" -c requirements/cpu-constraints.txt -r requirements/cpu.txt
  "${PIP[@]}" -c requirements/cpu-constraints.txt --no-deps -e ".[test]"
  "${PIP[@]}" -c requirements/cpu-constraints.txt -r requirements/test.txt
  "$VENV/bin/python" -m sglang_continuum.cpushim_install
  echo "$want" > "$STAMP"
  echo "[setup] environment built in $(( $(date +%s) - t0 ))s"
fi
"$VENV/bin/python" -m sglang_continuum.tools.tiny_model --out "$ROOT/.models/tiny-llama" --if-missing
