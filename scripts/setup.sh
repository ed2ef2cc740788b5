#!/usr/bin/env bash
# Idempotent set-up of a CPU environment with real SGLang 0.5.23 and sglang-continuum.
#
# Creates .venv/ under the repo (ignored by git), installs the pinned CPU stack, this package in
# editable mode, the CPU shim (cpushim/, see docs/cpu-shim.md), and builds the
# embedded tiny model under .models/. A stamp keyed on the inputs makes a second run a no-op.
# torch comes through pip, which takes the CPU build from this machine's wheel directory
# ($PIP_FIND_LINKS); everything else through uv (pinned in requirements/setup.txt), which installs
# the same packages in about a third of pip's time.
# GPU hosts do not use this script: `pip install "./sglang-continuum[gpu]"` from a clone (docs/install.md).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
STAMP="$VENV/.continuum-setup-stamp"

want=$(cat scripts/setup.sh requirements/*.txt pyproject.toml lab/pyproject.toml cpushim/*.py cpushim/*.pth cpushim/sgl_kernel/*.py | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
  echo "[setup] environment up to date ($VENV)"
else
  t0=$(date +%s)
  rm -f "$STAMP"  # stamped again only once everything below succeeded
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  # pip's own conflict report is switched off (--no-warn-conflicts): sglang and torchvision are
  # installed without their dependency metadata on purpose, so it would list ~40 expected
  # differences on every fresh install. check_dependencies below tells those from real ones.
  pip_install() {
    local out
    if ! out=$("$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-warn-conflicts \
      -c requirements/cpu-constraints.txt "$@" 2>&1); then
      printf '%s\n' "$out" >&2
      echo "[setup] FAILED: pip install $* (pip's output above); nothing was stamped, fix and re-run" >&2
      exit 1
    fi
    printf '%s\n' "$out" | grep -v -e "^WARNING: Location" -e '^$' || true
  }
  # compiled to bytecode as pip does: this machine's Python never writes .pyc itself
  # (PYTHONDONTWRITEBYTECODE), so without it every server start would compile SGLang again
  uv_install() {
    if ! "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" --compile-bytecode \
      -c requirements/cpu-constraints.txt "$@"; then
      echo "[setup] FAILED: uv pip install $* (its output above); nothing was stamped, fix and re-run" >&2
      exit 1
    fi
  }
  # `pip check`, less what installing sglang/torchvision with --no-deps implies: their
  # requirements name CUDA-only packages and pin other versions (torch 2.14.1, ...) than this CPU
  # stack. Those are summed up in one line; any other conflict is printed in full.
  check_dependencies() {
    local report expected unexpected
    report=$("$VENV/bin/python" -m pip check 2>&1 || true)
    expected=$(printf '%s\n' "$report" | grep -c -E '^(sglang 0\.5\.23|torchvision 0\.28\.0) ' || true)
    unexpected=$(printf '%s\n' "$report" | grep -v -E '^(sglang 0\.5\.23|torchvision 0\.28\.0) |^No broken requirements|^$' || true)
    echo "[setup] sglang 0.5.23 and torchvision are installed without their dependency metadata (it names CUDA-only" \
      "packages and torch 2.14.1): $expected expected differences from it, not problems (\`.venv/bin/pip check\` lists them)"
    if [ -n "$unexpected" ]; then
      echo "[setup] WARNING: other dependency conflicts (not expected):" >&2
      printf '%s\n' "$unexpected" >&2
    fi
  }
  pip_install -r requirements/setup.txt
  # torch first, the CPU build: a plain resolve would pull CUDA torch and ~5 GB of nvidia wheels.
  pip_install "torch==2.13.0"
  # sglang and torchvision without their dependency metadata (both name CUDA-only packages).
  uv_install --no-deps "sglang==0.5.23" "torchvision==0.28.0"
  uv_install -r requirements/cpu.txt -r requirements/test.txt -r requirements/agents.txt -r requirements/router.txt
  uv_install --no-deps -e .
  uv_install --no-deps -e lab  # after the plugin: the console scripts are the lab's
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  cp -r cpushim/continuum_cpushim.py cpushim/continuum_cpushim.pth cpushim/sgl_kernel "$site/"
  "$VENV/bin/python" -c "import sglang, torchvision, sglang_continuum.adapter.plugin, continuum_lab.cli.bench" \
    || { echo "[setup] FAILED: import check (sglang, torchvision, the plugin); nothing was stamped" >&2; exit 1; }
  check_dependencies
  echo "$want" > "$STAMP"
  echo "[setup] environment built in $(( $(date +%s) - t0 ))s"
fi
"$VENV/bin/python" -m continuum_lab.harness.tiny_model --out "$ROOT/.models/tiny-llama" --if-missing
# Prometheus, for tests/e2e/test_prometheus.py (the Grafana dashboard's queries against a real
# server): Debian's package, installed only where it is missing and can be (root, apt-get);
# elsewhere that test skips and says why. Outside the stamp: a present binary makes it a no-op.
if command -v prometheus >/dev/null 2>&1; then
  echo "[setup] prometheus present ($(command -v prometheus))"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt_prometheus() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1; }
  if apt_prometheus || { apt-get update -q >/dev/null 2>&1 && apt_prometheus; }; then
    echo "[setup] prometheus installed ($(command -v prometheus))"
  else
    echo "[setup] WARNING: apt-get could not install prometheus: tests/e2e/test_prometheus.py will skip" >&2
  fi
else
  echo "[setup] no prometheus (installing it needs root and apt-get): tests/e2e/test_prometheus.py will skip"
fi
