"""scripts/recorded_sessions.sh end to end with a stand-in for the bench: every grid's report is
copied (a grid at one N draws no plots), and each bench call gets the flags its report claims."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "recorded_sessions.sh"

FAKE_PYTHON = r"""#!/usr/bin/env bash
# stands in for `python -m continuum_lab.cli.bench`: records the call, writes what the bench writes
printf '%s\n' "$*" >> "$CALLS"
out= sessions= policies= seeds=
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift ;; --sessions) sessions=$2; shift ;;
    --policies) policies=$2; shift ;; --seeds) seeds=$2; shift ;;
  esac
  shift
done
mkdir -p "$out/runs"
for p in ${policies//,/ }; do for n in ${sessions//,/ }; do for s in ${seeds//,/ }; do
  echo '{}' > "$out/runs/$p-n$n-s$s-r0.json"
done; done; done
echo "# report" > "$out/report.md"
case "$sessions" in *,*) touch "$out/throughput.png" "$out/ttft-p90.png" ;; esac  # plots for a sweep only
"""


def test_every_grid_report_is_copied(tmp_path):
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    calls = tmp_path / "calls.txt"
    out = tmp_path / "out"
    env = {**os.environ, "PY": str(fake), "RUNS": str(tmp_path / "runs"), "CALLS": str(calls)}
    r = subprocess.run(["bash", str(SCRIPT), str(out)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = calls.read_text().splitlines()
    grids = [line.split("--out ")[1].split()[0].rsplit("/", 1)[1] for line in lines]
    assert "miniswe-no-host" in grids and "claude-code-capped-seeds" in grids
    for grid in grids:
        assert (out / grid / "report.md").is_file(), grid
    assert (out / "claude-code-capped" / "throughput.png").is_file()  # a sweep over N keeps its plots
    no_host = next(line for line in lines if "miniswe-no-host" in line)
    assert "--warmup-s 600" in no_host and "--window-s 1200" in no_host
    assert "hicache" not in no_host  # no host tier at all, not even its size
