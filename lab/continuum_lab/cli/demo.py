"""The main job's closing summary (``scripts/demo.sh``): what was compared, the ratios, their
spread, where the plots are -- for the emulated part and the measured part, each labelled.

    python -m continuum_lab.cli.demo OUT    (reads OUT/emulated and OUT/measured)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional

import numpy as np

PARTS = (
    (
        "emulated",
        "PREDICTED at GPU scale (emulator: SGLang 0.5.23's real scheduler and this plugin in virtual time, "
        "H100 + Llama-3.1-8B step latencies from NVIDIA's per-op data; not measured on a GPU)",
    ),
    (
        "measured",
        "MEASURED on this machine (real SGLang 0.5.23 servers on CPU, the embedded tiny model, a KV pool "
        "that cannot hold every program)",
    ),
)


def _sum_runs(report: dict, policy: str, key: str) -> float:
    return float(sum(r["summary"].get(key, 0.0) for r in report["runs"] if r["policy"] == policy))


def part_summary(report: dict, policy: str = "continuum") -> list[str]:
    rows = {r["policy"]: r for r in report["across_seeds"]}
    me: Optional[dict] = rows.get(policy)
    if me is None:
        return [f"  (no {policy} runs)"]
    seeds = report.get("seeds", [])
    lines = [
        f"  workload {Path(report['workload']).name}: {report.get('programs', '?')} programs at "
        f"{me['jps']:g} programs/s, KV pool {report.get('kv_pool_tokens', '?')} tokens, seeds {seeds}",
        *(
            [f"  load chosen by measuring this machine (--jps auto): {report['calibration']['reason']}"]
            if report.get("calibration")
            else []
        ),
        "  policy          median mean JCT   IQR               worst     cache hit   pin hits (all seeds)",
    ]
    for name, r in rows.items():
        lines.append(
            f"  {name:<15} {r['jct_mean_median_s']:>10.2f} s   "
            f"{r['jct_mean_p25_s']:>7.2f}-{r['jct_mean_p75_s']:<7.2f} s  {r['jct_mean_worst_s']:>7.2f} s "
            f"{r['cache_hit_median']:>9.1%}   {_sum_runs(report, name, 'pin_hits'):>8.0f}"
        )
    per_run = me["ratio_vs_fcfs_per_run"]
    best = me.get("best_stock")
    lines.append(
        f"  => {policy}: {me['ratio_vs_fcfs_median']:.2f}x vs fcfs (median over seeds of fcfs's mean JCT / "
        f"{policy}'s; per seed {min(per_run):.2f}x-{max(per_run):.2f}x)"
        + (f", {me['ratio_vs_best_stock_median']:.2f}x vs the best stock policy ({best})" if best else "")
        + f"; collapsed runs: {me['collapsed_runs']} (fcfs: {rows.get('fcfs', {}).get('collapsed_runs', '?')})"
    )
    return lines


def summarize(out: Path) -> str:
    text = ["", "=" * 100, "sglang-continuum demo: fcfs / lpm (SGLang's stock policies) vs continuum, over seeds", ""]
    for part, label in PARTS:
        path = out / part / "report.json"
        text.append(f"{part.upper()}: {label}")
        if not path.is_file():
            text += ["  (not run)", ""]
            continue
        report = json.loads(path.read_text())
        text += part_summary(report)
        text.append(f"  report: {out / part / 'report.md'}; plots: {out / part / 'jct_cdf.png'}, ...")
        text.append("")
    text.append(
        "Ratios are fcfs's mean JCT over continuum's on the same seed (>1: continuum faster); the median over "
        "seeds is the headline, the range its spread. A policy 'collapsed' on a seed when its cache hit fell "
        "below half its median over seeds (every turn re-prefills)."
    )
    return "\n".join(text)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    text = summarize(args.out)
    print(text)
    (args.out / "summary.txt").write_text(text.lstrip("\n") + "\n")
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    raise SystemExit(main())
