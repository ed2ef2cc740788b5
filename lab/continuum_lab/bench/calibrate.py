"""Offered load relative to the machine: ``continuum-bench --jps auto`` / ``--load X``.

A load fixed in programs per second offers a different pressure on every machine: the same
5 programs/s that drives fcfs and lpm into the re-prefill spiral on one machine leaves a machine
twice as fast idle between bursts, where every policy finishes alike (docs/results/demo/). With
``--load X`` the bench instead measures how fast this server prefills, just before the first run,
and offers X times the rate at which it could serve the workload's programs:

* probe lengths: ``PROBE_QUANTILES`` of the workload's turn prompts, weighted by tokens (the
  prompts in which the prefill work lies);
* prefill rate (tokens/s): each length sent fresh (random ids, ``max_new_tokens=1``), one warm-up
  then the median of ``repeats``, the lengths' tokens summed over their seconds summed -- the
  same /generate latency ``continuum-profile`` measures, so HTTP and tokenizer overhead count as
  they do for the workload's turns;
* service rate (programs/s): the prefill rate over the tokens one program sends in all, every
  turn's whole context (what serving it costs when nothing is cached);
* ``jps = X * service rate``: X is the offered work over the machine's capacity to do it without
  a cache. Above 1 the pool decides: a policy that keeps programs' contexts keeps up, one that
  re-prefills them falls behind (with a finite burst of programs the backlog ends when it ends);
* ``--tool-ratio T`` (optional): every tool duration scaled so that a program's tools take T times
  its no-cache prefill time here. The rate alone holds the offered work, not the share of a
  program's life spent in tools: on a machine twice as fast the same tool seconds weigh twice as
  much and the pool empties between turns. With both, every time in the run scales with the
  machine, and the same pressure is offered on a machine of any speed.

Emulated (``--emulate PROFILE``), the probe's seconds are the profile's prediction for the same
prompts, so the emulator picks the load a machine of that profile's speed would measure. The
arithmetic here is pure (unit-tested); the probe itself is ``probe_server``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Optional, Sequence

from continuum_lab.workloads.schema import Program

# offered load of --jps auto, in units of the machine's no-cache service rate (see calibrated_jps);
# chosen in docs/results/demo/README.md#the-measured-parts-load
DEFAULT_LOAD = 4.5
PROBE_QUANTILES = (0.1, 0.3, 0.5, 0.7, 0.9)
PROBE_REPEATS = 3


def turn_prompts(program: Program) -> list[int]:
    """Each turn's prompt length as the replay sends it: the whole context so far (earlier turns'
    appended and output tokens) plus the turn's own appended tokens."""
    out, context = [], 0
    for turn in program.turns:
        context += turn.append_tokens
        out.append(context)
        context += turn.output_tokens
    return out


def program_prompt_tokens(programs: Sequence[Program]) -> float:
    """Mean prompt tokens one program sends over all its turns: its prefill work with no cache."""
    if not programs:
        raise ValueError("no programs")
    return sum(p.prefill_tokens for p in programs) / len(programs)


def program_tool_seconds(programs: Sequence[Program]) -> float:
    """Mean seconds one program spends in its tools."""
    if not programs:
        raise ValueError("no programs")
    return sum(t.tool_duration_s for p in programs for t in p.turns) / len(programs)


def tool_scale(tool_ratio: float, prefill_s_per_program: float, tool_s_per_program: float) -> float:
    """The factor on every tool duration that makes a program's tool time ``tool_ratio`` times
    its no-cache prefill time on this machine."""
    if tool_ratio <= 0 or prefill_s_per_program <= 0 or tool_s_per_program <= 0:
        raise ValueError(
            f"tool ratio, prefill and tool seconds must be positive: {tool_ratio}, {prefill_s_per_program}, "
            f"{tool_s_per_program}"
        )
    return tool_ratio * prefill_s_per_program / tool_s_per_program


def scale_tools(programs: Sequence[Program], factor: float) -> list[Program]:
    """The same programs with every tool duration times ``factor`` (tokens and order unchanged)."""
    return [
        p.model_copy(
            update={"turns": [t.model_copy(update={"tool_duration_s": t.tool_duration_s * factor}) for t in p.turns]}
        )
        for p in programs
    ]


def probe_lengths(programs: Sequence[Program], quantiles: Sequence[float] = PROBE_QUANTILES) -> list[int]:
    """Prompt lengths at ``quantiles`` of the workload's turns weighted by their tokens (a long
    prompt weighs as much as the tokens it holds: the work, not the count, is what is timed)."""
    prompts = sorted(n for p in programs for n in turn_prompts(p))
    if not prompts:
        raise ValueError("no turns")
    total = sum(prompts)
    out, seen, i = [], 0, 0
    for q in sorted(quantiles):
        if not 0 < q < 1:
            raise ValueError(f"quantile {q} not in (0, 1)")
        while i < len(prompts) - 1 and seen + prompts[i] < q * total:
            seen += prompts[i]
            i += 1
        out.append(prompts[i])
    return out


def prefill_rate(points: Sequence[tuple[int, float]]) -> float:
    """Tokens per second over probe points (tokens, seconds): summed tokens over summed seconds."""
    tokens = sum(n for n, _ in points)
    seconds = sum(s for _, s in points)
    if tokens <= 0 or seconds <= 0:
        raise ValueError(f"no prefill measured: {points!r}")
    return tokens / seconds


def calibrated_jps(load: float, rate_tokens_s: float, tokens_per_program: float) -> float:
    """Programs per second that offer ``load`` times the no-cache service rate
    (``rate_tokens_s / tokens_per_program`` programs/s)."""
    if load <= 0 or rate_tokens_s <= 0 or tokens_per_program <= 0:
        raise ValueError(f"load, rate and program size must be positive: {load}, {rate_tokens_s}, {tokens_per_program}")
    return load * rate_tokens_s / tokens_per_program


@dataclass
class Calibration:
    load: float
    points: list[tuple[int, float]]  # (prompt tokens, median seconds) per probe length
    tokens_per_program: float
    source: str  # what was timed: a server's URL, or "profile NAME (predicted)"
    programs: int
    tool_s_per_program: float = 0.0  # the workload's, as recorded
    tool_ratio: Optional[float] = None  # tool time / no-cache prefill time per program (None: tools as recorded)

    @property
    def rate_tokens_s(self) -> float:
        return prefill_rate(self.points)

    @property
    def service_rate(self) -> float:
        """Programs per second this machine could prefill with nothing cached."""
        return self.rate_tokens_s / self.tokens_per_program

    @property
    def jps(self) -> float:
        return _significant(calibrated_jps(self.load, self.rate_tokens_s, self.tokens_per_program), 3)

    @property
    def prefill_s_per_program(self) -> float:
        return self.tokens_per_program / self.rate_tokens_s

    @property
    def tool_scale(self) -> float:
        """The factor on the workload's tool durations (1: as recorded)."""
        if self.tool_ratio is None:
            return 1.0
        return _significant(tool_scale(self.tool_ratio, self.prefill_s_per_program, self.tool_s_per_program), 3)

    def reason(self) -> str:
        lengths = "/".join(str(n) for n, _ in self.points)
        return (
            f"load {self.load:g}x: {self.source} prefilled {self.rate_tokens_s:,.0f} tokens/s "
            f"(fresh prompts of {lengths} tokens, the workload's turn prompts at "
            f"{'/'.join(f'{q:.0%}' for q in PROBE_QUANTILES)} of its tokens); one program sends "
            f"{self.tokens_per_program:,.0f} prompt tokens over its turns, so with nothing cached this machine "
            f"serves {self.service_rate:.3f} programs/s; {self.load:g} x that = {self.jps:g} programs/s "
            f"({self.programs} programs arrive over ~{self.programs / self.jps:.1f} s)"
            + (
                ""
                if self.tool_ratio is None
                else f"; tool times x{self.tool_scale:g} (a program's {self.tool_s_per_program:.2f} s of tools become "
                f"{self.tool_ratio:g} x its {self.prefill_s_per_program:.2f} s of no-cache prefill here)"
            )
        )

    def headline(self) -> str:
        return f"**{self.jps:g} programs/s**; {self.reason()}."

    def to_dict(self) -> dict:
        return asdict(self) | {
            "rate_tokens_s": self.rate_tokens_s,
            "service_rate": self.service_rate,
            "jps": self.jps,
            "prefill_s_per_program": self.prefill_s_per_program,
            "tool_scale": self.tool_scale,
            "reason": self.reason(),
        }


def calibrate(
    programs: Sequence[Program],
    load: float,
    seconds: Callable[[list[int]], list[float]],
    source: str,
    tool_ratio: Optional[float] = None,
) -> Calibration:
    """``seconds(lengths)``: one fresh prefill's time per length (measured or predicted)."""
    lengths = probe_lengths(programs)
    return Calibration(
        load=load,
        points=list(zip(lengths, seconds(lengths))),
        tokens_per_program=program_prompt_tokens(programs),
        source=source,
        programs=len(programs),
        tool_s_per_program=program_tool_seconds(programs),
        tool_ratio=tool_ratio,
    )


def parse_load(jps: str, load: Optional[float]) -> tuple[list[float], Optional[float]]:
    """``--jps`` and ``--load`` as given -> (fixed loads in programs/s, calibrated load or None).
    ``--jps auto`` calibrates at ``--load`` (default ``DEFAULT_LOAD``); ``--load X`` alone implies it."""
    value = jps.strip().lower()
    if value == "auto":
        return [], DEFAULT_LOAD if load is None else _positive(load)
    if "auto" in value:
        raise ValueError("--jps auto calibrates one load: it does not sweep (give --jps auto alone)")
    if load is not None:
        if value:
            raise ValueError("--load sets the load from the machine's speed: give --jps auto (or no --jps), not both")
        return [], _positive(load)
    loads = [float(x) for x in value.split(",") if x.strip()]
    if not loads or min(loads) < 0:
        raise ValueError(f"--jps: programs per second, or auto; got {jps!r}")
    return loads, None


def _significant(x: float, digits: int) -> float:
    """``x`` to ``digits`` significant digits (a rate or factor as the report prints it)."""
    return float(f"{x:.{digits}g}")


def _positive(load: float) -> float:
    if not load > 0:
        raise ValueError(f"--load must be positive, got {load}")
    return float(load)


def predicted_seconds(latency) -> Callable[[list[int]], list[float]]:
    """The emulator's probe: a fresh prefill of each length as the step profile times it."""
    return lambda lengths: [latency.prefill_seconds([(n, 0)]) for n in lengths]


def measure_prefill(url: str, lengths: list[int], repeats: int, vocab: int, seed: int = 0) -> list[tuple[int, float]]:
    """Seconds a fresh prefill of each length takes on ``url``: random prompts, one warm-up, then
    the median of ``repeats`` (``continuum-profile``'s points, the calibration's probe)."""
    import random
    import statistics
    import time

    import httpx

    rng = random.Random(seed)
    points = []
    with httpx.Client(timeout=600) as client:
        for n in lengths:
            xs = []
            for _ in range(repeats + 1):
                ids = [rng.randrange(5, vocab) for _ in range(n)]
                t0 = time.perf_counter()
                body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1}}
                client.post(url + "/generate", json=body).raise_for_status()
                xs.append(time.perf_counter() - t0)
            points.append((n, statistics.median(xs[1:])))  # the first run warms up this length
            print(f"  {n:>7} tokens: {points[-1][1] * 1000:9.1f} ms", flush=True)
    return points


def probe_server(url: str, vocab: int, repeats: int = PROBE_REPEATS) -> Callable[[list[int]], list[float]]:
    """The real probe: fresh prompts of each length against ``url`` (one warm-up, then the
    median of ``repeats``; as ``continuum-profile`` times its points), then the radix cache
    flushed so the run starts as cold as the others."""

    def seconds(lengths: list[int]) -> list[float]:
        import httpx

        out = [s for _, s in measure_prefill(url, lengths, repeats, vocab, seed=12345)]
        with httpx.Client(timeout=600) as client:
            client.post(url + "/flush_cache").raise_for_status()
        return out

    return seconds


class AutoLoad:
    """``--jps auto`` in one bench command: calibrated once (on the first run's server, on --url,
    or from the emulated profile), then the same load for every run. ``programs``: the workload as
    the runs replay it (tool times scaled under a tool ratio); ``workload_path``: the same written
    out for emulated runs, which read a file."""

    def __init__(
        self, programs, load: float, tool_ratio: Optional[float], *, latency=None, vocab=500, cpus=None, out=None
    ):
        if tool_ratio is not None and program_tool_seconds(programs) <= 0:
            raise ValueError(
                "--tool-ratio scales tool times, and this workload's programs call no tool that takes time"
            )
        self.programs, self.load, self.tool_ratio = list(programs), load, tool_ratio
        self.latency, self.vocab, self.cpus, self.out = latency, vocab, cpus, out
        self.calibration: Optional[Calibration] = None
        self.workload_path = None

    def __call__(self, url: Optional[str] = None, who: str = "the server") -> Calibration:
        if self.calibration is not None:
            return self.calibration
        from continuum_lab.harness.server import on_cores
        from continuum_lab.workloads.schema import dump_workload

        if self.latency is not None:
            seconds, source = predicted_seconds(self.latency), f"profile {self.latency.name} (predicted)"
        else:
            print(f"calibrating the load: fresh prefills against {who} (then its cache is flushed)", flush=True)
            seconds, source = probe_server(url, self.vocab), who
        with on_cores(self.cpus):
            cal = self.calibration = calibrate(self.programs, self.load, seconds, source, self.tool_ratio)
        print(f"[load] {cal.jps:g} programs/s: {cal.reason()}", flush=True)
        if self.tool_ratio is not None:
            self.programs = scale_tools(self.programs, cal.tool_scale)
            if self.latency is not None and self.out is not None:
                self.workload_path = dump_workload(self.programs, self.out / "workload-calibrated.jsonl")
        return cal

    def first_run(self, url: str, what: str) -> float:
        """The programs/s, probed on the first run's server (or fleet) once it is up."""
        return self(url, f"the first run's {what}").jps
