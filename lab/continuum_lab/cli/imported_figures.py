"""Per-grid figures for docs/results/imported/README.md, from a `continuum-bench --emulate` OUT dir.

    python -m continuum_lab.cli.imported_figures OUT [OUT...] [--write DIR]

Reads OUT/report.json and OUT/runs/*.json (the per-run files, which are not committed) and
prints one markdown table per grid: per policy over seeds, the median and worst mean JCT, mean
JCT vs fcfs per seed, median cache hit, the time a program spends in the server (sum of its
turns' send-to-finish: JCT without the tool and human gaps), the worst single wait, the mean
wait of first and of later turns, pins made / pin hits, and the cost model's TTL decisions
(how many, how many chose 0 s, the sum of the TTLs chosen). With --write, the same figures go to
DIR/NAME/figures.json for each OUT named NAME.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def _ttl(metrics: str) -> tuple[float, float, float]:
    """(decisions, decisions that chose 0 s, sum of TTLs) from the TTL histogram."""
    count = zero = total = 0.0
    for line in metrics.splitlines():
        if line.startswith("sglang:continuum_ttl_seconds_count"):
            count = float(line.split()[-1])
        elif line.startswith("sglang:continuum_ttl_seconds_sum"):
            total = float(line.split()[-1])
        elif line.startswith("sglang:continuum_ttl_seconds_bucket") and 'le="0.0"' in line:
            zero = float(line.split()[-1])
    return count, zero, total


def run_figures(path: Path) -> dict:
    run = json.loads(path.read_text())
    programs = run["replay"]["programs"]
    turns = [t for p in programs for t in p["turns"]]
    waits = [t["first_token"] - t["send"] for t in turns]
    first = [t["first_token"] - t["send"] for t in turns if t["turn"] == 0]
    later = [t["first_token"] - t["send"] for t in turns if t["turn"] > 0]
    decisions, zero, ttl_sum = _ttl(run["metrics_after"])
    return {
        "policy": run["policy"],
        "seed": run["seed"],
        "jps": run["jps"],
        "mean_jct_s": statistics.mean(p["jct"] for p in programs),
        "server_s_per_program": statistics.mean(sum(t["finish"] - t["send"] for t in p["turns"]) for p in programs),
        "max_wait_s": max(waits),
        "mean_wait_first_turn_s": statistics.mean(first),
        "mean_wait_later_turns_s": statistics.mean(later) if later else 0.0,
        "ttl_decisions": decisions,
        "ttl_zero": zero,
        "ttl_sum_s": ttl_sum,
    }


def grid_figures(out: Path) -> dict:
    report = json.loads((out / "report.json").read_text())
    summaries = {(r["policy"], r["seed"], r["jps"]): r["summary"] for r in report["runs"]}
    runs = []
    for path in sorted((out / "runs").glob("*.json")):
        f = run_figures(path)
        s = summaries[(f["policy"], f["seed"], f["jps"])]
        f |= {k: s[k] for k in ("cache_hit_ratio", "pins_created", "pin_hits", "pin_expiries", "pin_sheds")}
        runs.append(f)
    return {
        "command": report["command"],
        "kv_pool_tokens": report["kv_pool_tokens"],
        "policies": report["policies"],
        "runs": runs,
    }


def table(fig: dict) -> str:
    runs = fig["runs"]
    policies = fig["policies"]
    fcfs = {r["seed"]: r["mean_jct_s"] for r in runs if r["policy"] == "fcfs"}
    med = statistics.median
    rows = [
        "| policy | median mean JCT s | worst mean JCT s | vs fcfs per seed | median cache hit | median in-server s per program"
        " | worst max wait s | mean wait first / later turns s | pins made / hits (all seeds) | TTL decisions: 0 s / all, TTL sum s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in policies:
        rs = sorted((r for r in runs if r["policy"] == p), key=lambda r: r["seed"])
        vs = " / ".join(f"{fcfs[r['seed']] / r['mean_jct_s']:.3f}x" for r in rs if r["seed"] in fcfs)
        dec = sum(r["ttl_decisions"] for r in rs)
        ttl = f"{sum(r['ttl_zero'] for r in rs):.0f} / {dec:.0f}, {sum(r['ttl_sum_s'] for r in rs):.1f}" if dec else "-"
        rows.append(
            f"| {p} | {med(r['mean_jct_s'] for r in rs):.2f} | {max(r['mean_jct_s'] for r in rs):.2f} | {vs} "
            f"| {med(r['cache_hit_ratio'] for r in rs):.1%} | {med(r['server_s_per_program'] for r in rs):.2f} "
            f"| {max(r['max_wait_s'] for r in rs):.1f} | {med(r['mean_wait_first_turn_s'] for r in rs):.2f} / "
            f"{med(r['mean_wait_later_turns_s'] for r in rs):.2f} "
            f"| {sum(r['pins_created'] for r in rs):.0f} / {sum(r['pin_hits'] for r in rs):.0f} | {ttl} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    write = None
    if "--write" in argv:
        i = argv.index("--write")
        write = Path(argv[i + 1])
        argv = argv[:i] + argv[i + 2 :]
    for out in map(Path, argv):
        fig = grid_figures(out)
        print(f"### {out.name} (pool {fig['kv_pool_tokens']} tokens)\n\n{table(fig)}\n")
        if write is not None:
            dest = write / out.name / "figures.json"
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(json.dumps(fig, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
