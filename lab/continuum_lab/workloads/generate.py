"""Seeded generators for agent workloads with the paper's statistics (Continuum, section 6).

* ``swe``  (SWE-bench via mini-swe-agent): 10.9 +- 2.1 turns, tool time 925 +- 3,550 ms
  (long-tailed, per-tool distributions), 70,126 +- 19,732 tokens per program.
* ``bfcl`` (BFCL v4 web search): 6.3 +- 2.3 turns, tool time 1,923 +- 2,133 ms,
  93,256 +- 68,687 tokens per program.

"Tokens per program" is read as the program's final context (all appended and generated tokens).
``token_scale`` shrinks every token count (small models on CPU), and ``turn_repeat`` k repeats the
turn sequence k times with token counts divided by k (the paper's turn-scaling experiment).

    python -m continuum_lab.workloads.generate swe --programs 24 --token-scale 0.02 --seed 0 \\
        --out workloads/swe-cpu.jsonl
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from continuum_lab.workloads.schema import Program, Turn, dump_workload


@dataclass(frozen=True)
class ToolMix:
    names: tuple[str, ...]
    weights: tuple[float, ...]
    scales: tuple[float, ...]  # each tool's mean relative to the overall mean


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    turns_mean: float
    turns_std: float
    tool_mean_s: float
    tool_std_s: float
    tokens_mean: float
    tokens_std: float
    first_append_share: float  # share of the context that is the first turn's prompt
    output_tokens_mean: float
    tools: ToolMix
    tool_shape: float  # per-tool lognormal spread as a share of the target std (calibrated)


SPECS = {
    "swe": WorkloadSpec(
        "swe",
        10.9,
        2.1,
        0.925,
        3.550,
        70_126,
        19_732,
        0.12,
        180,
        ToolMix(
            ("python", "grep", "find", "cat", "sed", "ls", "git", "pytest"),
            (0.22, 0.18, 0.10, 0.16, 0.10, 0.08, 0.06, 0.10),
            (0.8, 0.4, 0.6, 0.2, 0.3, 0.2, 0.5, 4.6),
        ),
        0.5,
    ),
    "bfcl": WorkloadSpec(
        "bfcl",
        6.3,
        2.3,
        1.923,
        2.133,
        93_256,
        68_687,
        0.05,
        150,
        ToolMix(("web_search", "fetch_url", "calculator"), (0.45, 0.45, 0.10), (0.7, 1.5, 0.1)),
        0.8,
    ),
}


def _lognormal_params(mean: float, std: float) -> tuple[float, float]:
    sigma2 = math.log(1.0 + (std / mean) ** 2)
    return math.log(mean) - sigma2 / 2.0, math.sqrt(sigma2)


def generate(
    kind: str,
    programs: int,
    *,
    seed: int = 0,
    token_scale: float = 1.0,
    turn_repeat: int = 1,
    min_turns: int = 2,
    max_tool_s: float = float("inf"),
    output_scale: float | None = None,
    tool_scale: float = 1.0,
) -> list[Program]:
    """``max_tool_s`` clips tool durations (short CPU runs; the full tail is the default) and
    ``tool_scale`` then scales them: with ``token_scale`` it keeps a smaller workload's tool time in
    proportion to its shorter turns, the same programs from the same draws;
    ``output_scale`` scales output tokens separately (default: ``token_scale``), e.g. to keep
    decode, which holds KV while it runs, a realistic share of the work for a tiny model."""
    output_scale = token_scale if output_scale is None else output_scale
    spec = SPECS[kind]
    rng = np.random.default_rng(seed)
    tools = spec.tools
    w = np.array(tools.weights) / np.sum(tools.weights)
    scale_norm = float(np.dot(w, tools.scales))  # so the mixture's mean is spec.tool_mean_s
    # Per-tool lognormal with one shape, so the mixture matches the target mean; its spread comes
    # from both the shape and the differences between tools.
    _, sigma = _lognormal_params(spec.tool_mean_s, spec.tool_std_s * spec.tool_shape)
    tok_mu, tok_sigma = _lognormal_params(spec.tokens_mean, spec.tokens_std)
    out: list[Program] = []
    for i in range(programs):
        n = max(min_turns, int(round(rng.normal(spec.turns_mean, spec.turns_std))))
        total = float(rng.lognormal(tok_mu, tok_sigma))
        outputs = rng.poisson(spec.output_tokens_mean, size=n).clip(8, None).astype(float)
        first = total * spec.first_append_share
        rest = max(0.0, total - first - outputs.sum())
        shares = rng.dirichlet(np.full(n - 1, 1.5)) if n > 1 else np.zeros(0)
        appends = np.concatenate([[first], rest * shares])
        turns = []
        for t in range(n):
            k = rng.choice(len(tools.names), p=w)
            last = t == n - 1
            mean = spec.tool_mean_s * tools.scales[k] / scale_norm
            duration = 0.0 if last else min(max_tool_s, float(rng.lognormal(math.log(mean) - sigma**2 / 2, sigma)))
            turns.append((appends[t], outputs[t], None if last else tools.names[k], duration))
        if turn_repeat > 1:  # the same program k times longer, tokens divided by k
            body = turns[:-1] + [(turns[-1][0], turns[-1][1], turns[0][2], turns[0][3])]
            turns = (body * turn_repeat)[: n * turn_repeat]
            turns[-1] = (turns[-1][0], turns[-1][1], None, 0.0)
        div = turn_repeat
        out.append(
            Program(
                program_id=f"{kind}-{seed}-{i:04d}",
                turns=[
                    Turn(
                        append_tokens=max(1, int(round(a * token_scale / div))),
                        output_tokens=max(1, int(round(o * output_scale / div))),
                        tool=tool,
                        tool_duration_s=round(d * tool_scale, 4),
                    )
                    for a, o, tool, d in turns
                ],
            )
        )
    return out


def peak_context(program: Program) -> int:
    """The longest prompt plus output any turn of ``program`` sends (its last turn's)."""
    return sum(t.append_tokens + t.output_tokens for t in program.turns)


def summary(programs: list[Program]) -> dict:
    turns = np.array([len(p.turns) for p in programs])
    tools = np.array([t.tool_duration_s for p in programs for t in p.turns[:-1]])
    tokens = np.array([p.context_tokens for p in programs])
    return {
        "programs": len(programs),
        "turns_mean": float(turns.mean()),
        "turns_std": float(turns.std()),
        "tool_ms_mean": float(tools.mean() * 1000) if tools.size else 0.0,
        "tool_ms_std": float(tools.std() * 1000) if tools.size else 0.0,
        "tokens_mean": float(tokens.mean()),
        "tokens_std": float(tokens.std()),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Generate a seeded agent workload (JSONL).")
    ap.add_argument("kind", choices=sorted(SPECS))
    ap.add_argument("--programs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--token-scale", type=float, default=1.0)
    ap.add_argument("--turn-repeat", type=int, default=1)
    ap.add_argument("--max-tool-s", type=float, default=float("inf"), help="clip tool durations (seconds)")
    ap.add_argument("--output-scale", type=float, default=None, help="output token scale (default: --token-scale)")
    ap.add_argument("--tool-scale", type=float, default=1.0, help="scale tool durations (after --max-tool-s)")
    ap.add_argument(
        "--max-context",
        type=int,
        default=0,
        help="leave out programs whose context would outgrow this many tokens (a model's limit); 0 = keep all",
    )
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    programs = generate(
        args.kind,
        args.programs,
        seed=args.seed,
        token_scale=args.token_scale,
        turn_repeat=args.turn_repeat,
        max_tool_s=args.max_tool_s,
        output_scale=args.output_scale,
        tool_scale=args.tool_scale,
    )
    if args.max_context > 0:
        kept = [p for p in programs if peak_context(p) <= args.max_context]
        for p in programs:
            if peak_context(p) > args.max_context:
                print(f"left out {p.program_id}: its context reaches {peak_context(p)} > {args.max_context} tokens")
        programs = kept
    dump_workload(programs, args.out)
    print(f"wrote {args.out}: {summary(programs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
