"""How should bash tool calls be classed? Compare `cd X && cmd` -> "cd" with -> "cmd".

For each choice it prints the classes, their sizes and duration spread, and the pooled
within-class standard deviation of tool time (lower = a class predicts its duration better, which
is what the per-tool CDF in the TTL model needs).

    python -m continuum_lab.cli.analyze_tool_classes tests/data/swe_smith_5_trajectories_with_tool_times.json
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

import numpy as np

from sglang_continuum.core.tool_calls import first_executable

DEFAULT_DATA = "tests/data/swe_smith_5_trajectories_with_tool_times.json"  # run from the checkout


def calls(path):
    for traj in json.load(open(path)):
        msgs = traj["messages"]
        msgs = json.loads(msgs) if isinstance(msgs, str) else msgs
        for m in msgs:
            for tc in m.get("tool_calls") or []:
                args = json.loads(tc["function"]["arguments"] or "{}")
                if tc["function"]["name"] == "bash" and "command" in args:
                    yield args["command"], float(tc.get("execution_time_seconds") or 0.0)


def report(rows, skip_cd):
    groups = defaultdict(list)
    for cmd, t in rows:
        groups[first_executable(cmd, skip_cd=skip_cd) or "unknown"].append(t)
    n = sum(len(v) for v in groups.values())
    pooled = np.sqrt(sum(((np.array(v) - np.mean(v)) ** 2).sum() for v in groups.values()) / max(1, n - len(groups)))
    print(f"skip_cd={skip_cd}: {len(groups)} classes, pooled within-class std {pooled * 1000:.1f} ms")
    for name, v in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        print(f"  {name:>10} n={len(v):3d} mean={np.mean(v) * 1000:7.1f} ms std={np.std(v) * 1000:6.1f} ms")
    return pooled


def main(path):
    rows = list(calls(path))
    print(f"{len(rows)} bash calls")
    a, b = report(rows, skip_cd=False), report(rows, skip_cd=True)
    print(f"skipping `cd X &&` changes pooled std by {(b - a) * 1000:+.1f} ms")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_DATA)
