#!/usr/bin/env bash
# Idempotent set-up of a CPU environment with real SGLang 0.5.23 and sglang-continuum.
#
# Creates .venv/ under the repo (ignored by git), installs the pinned CPU stack, this package in
# editable mode, the CPU shim (cpushim/, see README "Running SGLang on CPU"), and builds the
# embedded tiny model under .models/. A stamp keyed on the inputs makes a second run a no-op.
# GPU hosts do not use this script: `pip install sglang-continuum[gpu]`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
STAMP="$VENV/.continuum-setup-stamp"

want=$(cat scripts/setup.sh requirements/*.txt pyproject.toml cpushim/*.py cpushim/*.pth cpushim/sgl_kernel/*.py | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
  echo "[setup] environment up to date ($VENV)"
else
  t0=$(date +%s)
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  pip_install() { "$VENV/bin/python" -m pip install -q --disable-pip-version-check -c requirements/cpu-constraints.txt "$@" 2>&1 | grep -v "^WARNING: Location" || true; }
  # torch first, the CPU build: a plain resolve would pull CUDA torch and ~5 GB of nvidia wheels.
  pip_install "torch==2.13.0"
  # sglang and torchvision without their dependency metadata (both name CUDA-only packages).
  pip_install --no-deps "sglang==0.5.23" "torchvision==0.28.0"
  pip_install -r requirements/cpu.txt -r requirements/test.txt -r requirements/agents.txt -r requirements/router.txt
  pip_install --no-deps -e .
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  cp -r cpushim/continuum_cpushim.py cpushim/continuum_cpushim.pth cpushim/sgl_kernel "$site/"
  "$VENV/bin/python" -c "import sglang, torchvision, sglang_continuum.adapter.plugin" \
    || { echo "[setup] import check failed" >&2; exit 1; }
  echo "$want" > "$STAMP"
  echo "[setup] environment built in $(( $(date +%s) - t0 ))s"
fi
"$VENV/bin/python" -m sglang_continuum.tools.tiny_model --out "$ROOT/.models/tiny-llama" --if-missing
