"""Compare an emulated ``continuum-bench`` report with a real-server one of the same grid.

    python -m continuum_lab.emulator.validate --real docs/results/seeds-cpu/report.json \\
        --emulated docs/results/emulator-validation/report.json --out docs/results/emulator-validation

Writes ``validation.md`` (per policy: median mean JCT on each side and their ratio, the two
rankings, cache hit, and per-turn wait and turn-latency quantiles side by side) and
``turn-wait-cdf.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

QUANTILES = (50, 90, 99)
TOLERANCE = 0.15  # issue 24's target: each policy's median mean JCT within 15% of the real server's


def _by_policy(report: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for run in report["runs"]:
        out.setdefault(run["policy"], []).append(run)
    return out


def _turns(runs: list[dict]) -> list[dict]:
    return [t for r in runs for p in r["replay"]["programs"] for t in p["turns"] if t.get("error") is None]


def _wait(t: dict) -> float:
    # the server reports SGLang's queue_time; the emulator the time to first admission
    return t["queue_time_s"] if t.get("queue_time_s") is not None else t["ttft"]


def compare(real: dict, emulated: dict) -> dict:
    r, e = _by_policy(real), _by_policy(emulated)
    rows = []
    for policy in [p for p in r if p in e]:
        row = {"policy": policy}
        for side, runs in (("real", r[policy]), ("emulated", e[policy])):
            turns = _turns(runs)
            row[side] = {
                "median_mean_jct_s": float(np.median([x["summary"]["jct_mean_s"] for x in runs])),
                "median_cache_hit": float(np.median([x["summary"]["cache_hit_ratio"] for x in runs])),
                "turn_wait_s": {q: float(np.percentile([_wait(t) for t in turns], q)) for q in QUANTILES},
                "ttft_s": {q: float(np.percentile([t["ttft"] for t in turns], q)) for q in QUANTILES},
                "turn_latency_s": {
                    q: float(np.percentile([t["finish"] - t["send"] for t in turns], q)) for q in QUANTILES
                },
                "runs": len(runs),
            }
            forward = [x["summary"].get("server_forward_s") for x in runs]
            if all(f is not None for f in forward):  # reports made before the field have none
                row[side]["median_forward_s"] = float(np.median(forward))
        row["emulated_over_real"] = row["emulated"]["median_mean_jct_s"] / row["real"]["median_mean_jct_s"]
        row["within_tolerance"] = abs(row["emulated_over_real"] - 1) <= TOLERANCE
        rows.append(row)
    rank = lambda side: [x["policy"] for x in sorted(rows, key=lambda x: x[side]["median_mean_jct_s"])]  # noqa: E731
    return {
        "rows": rows,
        "ranking_real": rank("real"),
        "ranking_emulated": rank("emulated"),
        "all_within_tolerance": all(row["within_tolerance"] for row in rows),
    }


def markdown(result: dict, real_path: str, emulated_path: str) -> str:
    lines = [
        "| policy | real median mean JCT s | emulated | emulated / real | real cache hit | emulated | "
        "forward s real | emulated | "
        "turn TTFT P50/P90/P99 s real | emulated | turn latency P50/P90 s real | emulated |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    q = lambda d: "/".join(f"{d[k]:.2f}" for k in QUANTILES)  # noqa: E731
    f = lambda d: f"{d['median_forward_s']:.1f}" if "median_forward_s" in d else "-"  # noqa: E731
    for row in result["rows"]:
        re_, em = row["real"], row["emulated"]
        lines.append(
            f"| {row['policy']} | {re_['median_mean_jct_s']:.2f} | {em['median_mean_jct_s']:.2f} | "
            f"{row['emulated_over_real']:.2f} | {re_['median_cache_hit']:.1%} | {em['median_cache_hit']:.1%} | "
            f"{f(re_)} | {f(em)} | "
            f"{q(re_['ttft_s'])} | {q(em['ttft_s'])} | "
            f"{re_['turn_latency_s'][50]:.2f}/{re_['turn_latency_s'][90]:.2f} | "
            f"{em['turn_latency_s'][50]:.2f}/{em['turn_latency_s'][90]:.2f} |"
        )
    return "\n".join(
        [
            f"Real: `{real_path}`; emulated: `{emulated_path}`.",
            "",
            *lines,
            "",
            f"Ranking by median mean JCT, real: {', '.join(result['ranking_real'])}.",
            f"Ranking, emulated: {', '.join(result['ranking_emulated'])}.",
            f"Every policy within {TOLERANCE:.0%}: {'yes' if result['all_within_tolerance'] else 'no'} "
            f"(outside: {', '.join(r['policy'] for r in result['rows'] if not r['within_tolerance']) or 'none'}).",
        ]
    )


def plot_waits(real: dict, emulated: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r, e = _by_policy(real), _by_policy(emulated)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, policy in enumerate(p for p in r if p in e):
        color = f"C{i}"
        for side, runs, style in (("real", r[policy], "-"), ("emulated", e[policy], "--")):
            x = np.sort([t["ttft"] for t in _turns(runs)])
            ax.plot(x, np.arange(1, x.size + 1) / x.size, style, color=color, label=f"{policy} ({side})")
    ax.set_xscale("log")
    ax.set_xlabel("turn time to first token, s (queue + prefill)")
    ax.set_ylabel("share of turns")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    path = out / "turn-ttft-cdf.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", type=Path, required=True)
    ap.add_argument("--emulated", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    real, emulated = json.loads(args.real.read_text()), json.loads(args.emulated.read_text())
    result = compare(real, emulated)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "validation.json").write_text(json.dumps(result, indent=1))
    (args.out / "validation.md").write_text(markdown(result, str(args.real), str(args.emulated)) + "\n")
    plot_waits(real, emulated, args.out)
    print(markdown(result, str(args.real), str(args.emulated)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
