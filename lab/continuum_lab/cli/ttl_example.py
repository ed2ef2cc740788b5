"""Worked example: the TTLs the cost model chooses from the 5 real SWE-agent trajectories.

Tool times come from ``execution_time_seconds``; tools are classed as the server would
(``bash:<first executable>``, ``str_replace_editor``, ...). With K lowered to 10 (the sample has
125 calls, the default K is 100) the chain uses each tool's own CDF once it has more than 10
samples and the global CDF otherwise. Printed for three benefits B = T*eta + PrefillReload.

    python -m continuum_lab.cli.ttl_example [tests/data/swe_smith_5_trajectories_with_tool_times.json]
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

from sglang_continuum.core.cost_model import CostModelTTL, PrefillProfile
from sglang_continuum.core.settings import ContinuumSettings
from sglang_continuum.core.tool_calls import from_openai_tool_calls
from sglang_continuum.core.tool_stats import ToolStats
from sglang_continuum.core.ttl import TTLQuery

DEFAULT_DATA = "tests/data/swe_smith_5_trajectories_with_tool_times.json"  # run from the checkout


def main(path: str) -> int:
    stats = ToolStats()
    per_tool = defaultdict(list)
    for traj in json.load(open(path)):
        for m in json.loads(traj["messages"]):
            for call in m.get("tool_calls") or []:
                tool = from_openai_tool_calls([call])
                stats.record(tool, call["execution_time_seconds"])
                per_tool[tool].append(call["execution_time_seconds"])
    print(f"{len(stats.global_samples)} tool calls, {len(per_tool)} tool classes")
    benefits = (0.05, 0.6, 5.0)
    print(f"{'tool':>22} {'n':>4} {'mean s':>8} {'max s':>8} " + " ".join(f"{'TTL@B=' + str(b):>11}" for b in benefits))
    for tool, xs in sorted(per_tool.items(), key=lambda kv: -len(kv[1])):
        ttls = []
        for b in benefits:
            model = CostModelTTL(ContinuumSettings(), stats, PrefillProfile((b, 0.0, 0.0)), cold_start_k=10)
            d = model.decide(TTLQuery(tool, 1000))
            ttls.append(f"{d.ttl:7.3f} {d.source[0]}")
        print(f"{tool:>22} {len(xs):>4} {sum(xs) / len(xs):8.3f} {max(xs):8.3f} " + " ".join(f"{t:>11}" for t in ttls))
    print("source: t = the tool's own CDF, g = the global CDF (tool has <= K samples)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_DATA))
