"""An RL rollout step: ``G`` prompts x ``n`` samples, as agent RL frameworks on SGLang run one.

slime, verl and AReaL release a whole step's programs at once: ``G`` groups of ``n`` samples that
share a prompt (e.g. 256 programs = 32 prompts x 8 samples), each sample a multi-turn agent
trajectory; the step ends when its last program does. Here every sample is drawn from a
generator's statistics (``generate.py``, SWE-like by default) on its own: its outputs, tools, tool
times and later turns. Only the first turn's prompt (system + task) is the group's: the same
number of tokens and, through ``Program.group``, the same token ids (the replay client and the
emulator draw a group's first prompt from the group's seed), so the radix cache can share it
across the group. Samples diverge from their first output on. Seeded and deterministic; programs
come group by group, as a framework submits them.

    rollout_step(32, 8, seed=1)  # 256 programs, ids rollout-s1-g000-00 .. rollout-s1-g031-07
"""

from __future__ import annotations

import re

from continuum_lab.workloads.generate import generate
from continuum_lab.workloads.schema import Program

SHAPE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


def parse_shape(text: str) -> tuple[int, int]:
    """``"32x8"`` -> ``(32, 8)``: prompts x samples per prompt."""
    match = SHAPE.match(text)
    if not match or int(match[1]) < 1 or int(match[2]) < 1:
        raise ValueError(f"a rollout is PROMPTSxSAMPLES, e.g. 32x8, not {text!r}")
    return int(match[1]), int(match[2])


def group_id(seed: int, group: int) -> str:
    return f"rollout-s{seed}-g{group:03d}"


def rollout_step(groups: int, samples: int, *, kind: str = "swe", seed: int = 0, **scales) -> list[Program]:
    """``groups`` x ``samples`` programs; ``scales``: ``generate``'s token, output and tool
    scales (``token_scale``, ``output_scale``, ``tool_scale``, ``max_tool_s``, ``min_turns``)."""
    if groups < 1 or samples < 1:
        raise ValueError("a rollout has at least one prompt and one sample")
    drawn = generate(kind, groups * samples, seed=seed, **scales)
    out = []
    for g in range(groups):
        group = group_id(seed, g)
        prompt = drawn[g * samples].turns[0].append_tokens  # the group's system + task prompt
        for k in range(samples):
            turns = drawn[g * samples + k].turns
            first = turns[0].model_copy(update={"append_tokens": prompt})
            out.append(Program(program_id=f"{group}-{k:02d}", group=group, turns=[first, *turns[1:]]))
    return out
