"""``continuum-agents``: real mini-swe-agent programs against a server, one program per task.

Each task (``workloads/tasks/*``: a tiny repository with a failing test) is one mini-swe-agent
2.4.6 ``DefaultAgent`` run in a ``LocalEnvironment`` on a fresh copy of the repository: the model
answers, the command really runs (its wall time is the tool time), the output goes back, until
the agent submits (``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``) or hits the step limit.

Every request of a task carries the task's program id three ways (the models of
``client/mini_swe_agent.py``): ``custom_params.program_id`` (Continuum), ``session_id`` (so
``/close_session`` ends it) and the ``X-SMG-Routing-Key`` header (SGLang's router). The last-step
flag is set only on the turn the step limit makes last; a run that ends otherwise (submit, format
errors) is released after the fact with ``/close_session`` (the server also recognises the submit
command by itself).

``--plain`` (``--identity plain``) runs mini-swe-agent unchanged: its stock model class
(``LitellmTextbasedModel`` for ``--mode text``, ``LitellmModel`` for native), no
``custom_params``, no ``session_id``, no routing-key header, no ``/close_session``, no last-step
flag. The server must infer each task's program from the prefix (``docs/program-identity.md``).
The grammar is the one thing still sent: ``--plain`` with the default ``--grammar`` puts only
``extra_body.ebnf`` in the request (a decoding constraint, no identity); ``--plain --no-grammar``
is literally stock (no ``extra_body`` at all). ``--identity ids,plain`` runs both, each on its own
fresh server when the CLI starts them, and reports them side by side: requests per identity source
(``/metrics`` deltas), later turns with cached tokens, pins made and hit, and, for a plain run on a
server started here, the attribution's precision and recall against the task each request belonged
to (the server's ``attribution_log``; each request's SGLang ``rid`` is the ``id`` of its response,
so the client knows it without sending anything; scored by ``bench/attribution.py``).

With ``--grammar`` (the default; needed for the embedded random model) decoding is forced by an
EBNF grammar (``extra_body.ebnf``) to one command from the task's command set or the submit, so a
random model takes real steps; with a real model, ``--no-grammar``. ``--mode text`` uses v2's
text format (```` ```mswea_bash_command ```` blocks, ``LitellmTextbasedModel``); ``--mode
native`` v2's default tool calls (``LitellmModel``, one ``bash`` function; the server needs
``--tool-call-parser``, qwen25 for the grammar used here).

    continuum-agents --url http://127.0.0.1:30000 --tasks workloads/tasks --concurrency 4 --out out/agents
    continuum-agents --model .models/tiny-llama --policies fcfs,continuum --tasks workloads/tasks --out DIR
    continuum-agents --model .models/tiny-llama --policies continuum --identity ids,plain --out DIR

The second and third forms start one CPU server per policy and identity (identical flags) and
write the runs side by side. Exit status 0 when every task ended by submit or step limit.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import httpx

from sglang_continuum.bench.attribution import read_log, score, turn_rid
from sglang_continuum.bench.fleet import ROUTER_POLICIES, Fleet
from sglang_continuum.core.series import series_name
from sglang_continuum.core.tool_calls import SUBMIT_SENTINELS, command_tool
from sglang_continuum.tools.server import SGLangServer, parse_metrics

SUBMIT_COMMAND = f"echo {SUBMIT_SENTINELS[0]}"
ENDED_OK = {"Submitted", "LimitsExceeded"}  # a task "ended" by submit or by its step limit
IDENTITIES = ("ids", "plain")  # program ids sent three ways | stock mini-swe-agent, nothing sent
# where each request's program id came from, as /metrics counts it (docs/program-identity.md)
IDENTITY_SERIES = {
    source: series_name(f"identity.{source}")
    for source in ("program_id", "session_id", "routing_key", "inferred", "none")
}
PIN_SERIES = {
    "pins_created": series_name("counters.created"),
    "pin_hits": series_name("counters.hits"),
    "pin_expiries": series_name("counters.expired"),
}
TTL_SERIES = series_name("ttl")  # histogram: its _sum and _count give the mean TTL decided
THOUGHTS = ("Let me look at the repository.", "Let me check the code.", "I will run the tests.", "I am done.")


@dataclass(frozen=True)
class AgentTask:
    name: str
    repo: Path
    task: str
    commands: tuple[str, ...]
    submit: bool = True  # the grammar offers the submit command (False: the run ends at the step limit)

    @classmethod
    def load(cls, folder: Path) -> "AgentTask":
        meta = json.loads((folder / "task.json").read_text())
        if not (folder / "repo").is_dir() or not isinstance(meta.get("task"), str):
            raise ValueError(f"{folder}: a task needs repo/ and task.json with a 'task' string")
        commands = tuple(meta.get("commands", ()))
        return cls(folder.name, folder / "repo", meta["task"], commands, bool(meta.get("submit", True)))


def load_tasks(root: Path) -> list[AgentTask]:
    tasks = [AgentTask.load(p) for p in sorted(Path(root).iterdir()) if (p / "task.json").is_file()]
    if not tasks:
        raise ValueError(f"no tasks (folders with task.json) under {root}")
    return tasks


def _lit(text: str) -> str:
    return json.dumps(text)  # an EBNF string literal: JSON escapes are the grammar's escapes


def command_grammar(commands: tuple[str, ...], mode: str, *, submit: bool = True) -> str:
    """EBNF (xgrammar) for one step: a short thought and exactly one command of the set or the
    submit, in mini-swe-agent v2's text block (``text``) or as a qwen25-style tool call
    (``native``)."""
    commands = (*commands, SUBMIT_COMMAND) if submit else tuple(commands)
    if not commands:
        raise ValueError("a grammar needs at least one command")
    if mode == "text":
        choices = " | ".join(_lit(c) for c in commands)
        thought = " | ".join(_lit(t) for t in THOUGHTS)
        return (
            'root ::= "THOUGHT: " thought "\\n\\n```mswea_bash_command\\n" command "\\n```"\n'
            f"thought ::= {thought}\ncommand ::= {choices}\n"
        )
    choices = " | ".join(_lit(json.dumps(c)[1:-1]) for c in commands)  # inside a JSON string
    head = _lit('<tool_call>\n{"name": "bash", "arguments": {"command": "')
    tail = _lit('"}}\n</tool_call>')
    return f"root ::= {head} command {tail}\ncommand ::= {choices}\n"


@dataclass
class TurnRecord:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    rid: Optional[str] = None  # SGLang's request id (the response's ``id``): the key of the attribution log
    command: Optional[str] = None
    tool: Optional[str] = None
    tool_s: Optional[float] = None
    returncode: Optional[int] = None


@dataclass
class TaskResult:
    task: str
    program_id: str  # the client's name for the run (sent to the server only with ids)
    exit_status: str
    steps: int
    jct_s: float
    turns: list[TurnRecord] = field(default_factory=list)
    error: Optional[str] = None

    @property
    def ended(self) -> bool:
        return self.exit_status in ENDED_OK


def _agent_classes():
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no cost-map download at import
    try:
        from minisweagent.agents.default import DefaultAgent
        from minisweagent.environments.local import LocalEnvironment
        from minisweagent.models.litellm_model import LitellmModel
        from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel

        from sglang_continuum.client.mini_swe_agent import ContinuumLitellmModel, ContinuumLitellmTextbasedModel
    except ImportError as exc:  # an optional dependency: requirements/agents.txt
        raise SystemExit(
            f"continuum-agents needs mini-swe-agent (pip install -r requirements/agents.txt): {exc}"
        ) from exc

    class TimedEnvironment(LocalEnvironment):
        """``LocalEnvironment`` that records each command's wall time (the real tool time)."""

        def __init__(self, **kwargs) -> None:
            super().__init__(**kwargs)
            self.records: list[tuple[str, float, Optional[int]]] = []

        def execute(self, action: dict, cwd: str = "", *, timeout: Optional[int] = None) -> dict:
            t0 = time.perf_counter()
            code: Optional[int] = None
            try:
                out = super().execute(action, cwd, timeout=timeout)
                code = out.get("returncode")
                return out
            except Exception:  # Submitted is raised after the command ran successfully
                code = 0
                raise
            finally:
                self.records.append((action.get("command", ""), time.perf_counter() - t0, code))

    class ProgramAgent(DefaultAgent):
        """Marks the turn that the step limit makes last (a model with program ids only; the stock
        models of ``--plain`` have no such flag); everything else is mini-swe-agent's."""

        def query(self) -> dict:
            mark = getattr(self.model, "mark_last_step", None)
            if mark is not None:
                mark(0 < self.config.step_limit == self.n_calls + 1, step=self.n_calls + 1)
            return super().query()

    models = {
        ("ids", "text"): ContinuumLitellmTextbasedModel,
        ("ids", "native"): ContinuumLitellmModel,
        ("plain", "text"): LitellmTextbasedModel,
        ("plain", "native"): LitellmModel,
    }
    return ProgramAgent, TimedEnvironment, models


def _agent_config(mode: str) -> dict:
    import yaml
    from minisweagent.config import builtin_config_dir

    name = "mini_textbased.yaml" if mode == "text" else "mini.yaml"
    return yaml.safe_load((builtin_config_dir / name).read_text())


def build_model(task: AgentTask, url: str, program_id: str, args, *, plain: bool = False):
    """The run's mini-swe-agent model: with ids, the program id goes with every request
    (``client/mini_swe_agent.py``); ``plain``, mini-swe-agent's stock class with nothing added but
    the grammar (``extra_body.ebnf``, a decoding constraint) when ``args.grammar``."""
    _, _, models = _agent_classes()
    config = _agent_config(args.mode)
    model_kwargs = {
        **(config.get("model", {}).get("model_kwargs") or {}),
        "api_base": url + "/v1",
        "api_key": "none",
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
    }
    if args.grammar:
        model_kwargs["extra_body"] = {"ebnf": command_grammar(task.commands, args.mode, submit=task.submit)}
    model_config = {k: v for k, v in config.get("model", {}).items() if k != "model_kwargs"}
    model_config |= {"model_name": f"openai/{args.model_name}", "model_kwargs": model_kwargs}
    # a local model has no litellm price: mini-swe-agent's own setting (its default is read from the
    # environment when minisweagent is first imported, which may be before _agent_classes runs)
    model_config.setdefault("cost_tracking", "ignore_errors")
    if plain:
        return models["plain", args.mode](**model_config)
    return models["ids", args.mode](program_id=program_id, **model_config)


def run_task(task: AgentTask, url: str, program_id: str, args, workdir: Path, *, plain: bool = False) -> TaskResult:
    ProgramAgent, TimedEnvironment, _ = _agent_classes()
    config = _agent_config(args.mode)
    repo = workdir / program_id
    shutil.copytree(task.repo, repo)
    model = build_model(task, url, program_id, args, plain=plain)
    env = TimedEnvironment(**{**config.get("environment", {}), "cwd": str(repo), "timeout": args.command_timeout_s})
    agent_config = {k: v for k, v in config.get("agent", {}).items() if k != "mode"}
    agent_config |= {"step_limit": args.step_limit, "cost_limit": 0.0, "output_path": None}
    agent = ProgramAgent(model, env, **agent_config)
    t0 = time.monotonic()
    error = None
    try:
        info = agent.run(task.task)
        status = info.get("exit_status") or "unknown"
    except Exception as exc:  # the run's error is the result; the other tasks go on
        status, error = type(exc).__name__, str(exc)[:500]
    jct = time.monotonic() - t0
    if not plain:
        model.close()  # /close_session: the program is over, whatever ended it
    turns = _turns(agent, env.records)  # also writes the tool times into the trajectory
    if args.out is not None:
        trajectories = Path(args.out) / "trajectories"
        trajectories.mkdir(parents=True, exist_ok=True)
        agent.save(trajectories / f"{program_id}.json")
    return TaskResult(task.name, program_id, status, agent.n_calls, jct, turns, error)


def _turns(agent, records) -> list[TurnRecord]:
    """One record per model call, in order: the assistant messages (each paired with the command
    it ran) and the format errors (mini-swe-agent keeps their response on the ``user`` message it
    sends back instead of the output). The tool time is also written into the trajectory
    (``extra.execution_time_seconds``) for the importer."""
    turns = []
    pending = iter(records)  # commands in the order they ran: one per assistant message with an action
    for message in agent.messages:
        extra = message.get("extra") or {}
        response = extra.get("response")
        if not isinstance(response, dict):  # not a model call (or an unserialisable response)
            continue
        usage = response.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        turn = TurnRecord(
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            cached_tokens=int(details.get("cached_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            rid=response.get("id"),
        )
        actions = extra.get("actions") if message.get("role") == "assistant" else None
        if actions:
            ran = [r for r in (next(pending, None) for _ in actions) if r is not None]
            if ran:  # native mode may run several tool calls of one message: the turn shows the first
                command, seconds, code = ran[0]
                seconds = sum(r[1] for r in ran)
                turn.command, turn.tool_s, turn.returncode = command, round(seconds, 4), code
                turn.tool = command_tool(command)
                extra["execution_time_seconds"] = seconds
        turns.append(turn)
    return turns


def score_attribution(results: list[TaskResult], log_path: Path) -> dict:
    """The server's attribution (``attribution_log``, keyed by ``rid``) against the truth the
    client knows: which task each request belonged to, in order. Scored by ``bench/attribution.py``
    (the same scorer as ``continuum-bench --no-ids``) after renaming each logged rid to
    ``<program>#<turn>``."""
    log = read_log(log_path)
    named: dict[str, tuple[str, str]] = {}
    for r in results:
        for i, turn in enumerate(r.turns):
            if turn.rid is not None and turn.rid in log:
                named[turn_rid(r.program_id, i)] = log[turn.rid]
    return score([(r.program_id, len(r.turns)) for r in results], named)


def summarize(results: list[TaskResult], metrics_delta: dict, pins_left: float) -> dict:
    later = [t for r in results for t in r.turns[1:]]  # turn index > 0 of each task
    prompt = sum(t.prompt_tokens for t in later)
    fractions = [t.cached_tokens / t.prompt_tokens for t in later if t.prompt_tokens]
    ttl_count = metrics_delta.get(f"{TTL_SERIES}_count", 0.0)
    tool_times = [t.tool_s for r in results for t in r.turns if t.tool_s is not None]
    return {
        "tasks": len(results),
        "ended": sum(r.ended for r in results),
        "exit_statuses": {
            s: sum(r.exit_status == s for r in results) for s in sorted({r.exit_status for r in results})
        },
        "mean_jct_s": statistics.fmean(r.jct_s for r in results) if results else 0.0,
        "max_jct_s": max((r.jct_s for r in results), default=0.0),
        "mean_steps": statistics.fmean(r.steps for r in results) if results else 0.0,
        "model_calls": sum(len(r.turns) for r in results),
        "later_turns": len(later),
        "later_turn_cached_fraction": sum(t.cached_tokens for t in later) / prompt if prompt else 0.0,
        "later_turns_with_cache": sum(t.cached_tokens > 0 for t in later) / len(later) if later else 0.0,
        "later_turn_mean_cached_fraction": statistics.fmean(fractions) if fractions else 0.0,
        "requests_by_source": {s: metrics_delta.get(name, 0.0) for s, name in IDENTITY_SERIES.items()},
        **{k: metrics_delta.get(name, 0.0) for k, name in PIN_SERIES.items()},
        "ttl_decisions": ttl_count,
        "mean_ttl_s": metrics_delta.get(f"{TTL_SERIES}_sum", 0.0) / ttl_count if ttl_count else None,
        "tool_calls": len(tool_times),
        "mean_tool_s": statistics.fmean(tool_times) if tool_times else 0.0,
        "pins_left_at_end": pins_left,
        "metrics_delta": metrics_delta,
    }


def _scrape(urls: list[str]) -> dict[str, float]:
    """Every series summed over the servers (the workers behind a router)."""
    try:
        return parse_metrics("\n".join(httpx.get(u + "/metrics", timeout=10).text for u in urls), prefix="sglang:")
    except httpx.HTTPError:
        return {}


def _pins_left(urls: list[str], wait_s: float = 10.0) -> float:
    """Pinned programs once the releases are handled (``/close_session`` is acknowledged first)."""
    deadline = time.monotonic() + wait_s
    while True:
        left = _scrape(urls).get("sglang:continuum_pinned_programs", 0.0)
        if left == 0 or time.monotonic() > deadline:
            return left
        time.sleep(0.25)


def run_fleet(
    url: str,
    tasks: list[AgentTask],
    args,
    label: str,
    metrics_urls: Optional[list[str]] = None,
    *,
    plain: bool = False,
    attribution_log: Optional[Path] = None,
) -> dict:
    """Every task (x ``--repeat``) through ``url``; metrics from ``metrics_urls`` (default ``url``).
    ``plain``: stock mini-swe-agent, no program metadata; ``attribution_log``: the server's log
    of where it attributed each request with no id (scored when given)."""
    metrics_urls = metrics_urls or [url]
    before = _scrape(metrics_urls)
    run_id = f"{label}-{int(time.time())}"
    with tempfile.TemporaryDirectory(prefix="continuum-agents-") as tmp:
        jobs = [(task, f"{run_id}-{task.name}-{k}") for k in range(args.repeat) for task in tasks]
        lock = threading.Lock()
        done: list[TaskResult] = []

        def one(job):
            result = run_task(job[0], url, job[1], args, Path(tmp), plain=plain)
            with lock:
                done.append(result)
                print(
                    f"  [{label}] {result.task}: {result.exit_status} after {result.steps} steps, "
                    f"{result.jct_s:.1f} s ({len(done)}/{len(jobs)})",
                    flush=True,
                )
            return result

        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
            results = list(pool.map(one, jobs))
        makespan = time.monotonic() - t0
    # with ids every run is released (/close_session); a plain run's pins end by TTL: no wait
    pins_left = _pins_left(metrics_urls, wait_s=0.0 if plain else 10.0)
    after = _scrape(metrics_urls)
    delta = {
        k: after[k] - before.get(k, 0.0)
        for k in after
        if k.endswith(("_total", "_sum", "_count")) and after[k] != before.get(k, 0.0)
    }
    summary = summarize(results, delta, pins_left) | {"makespan_s": makespan}
    if attribution_log is not None:
        summary["attribution"] = score_attribution(results, attribution_log)
    identity = "plain" if plain else "ids"
    return {"label": label, "identity": identity, "url": url, "summary": summary, "tasks": [asdict(r) for r in results]}


def write_report(out: Path, runs: list[dict], args, command: str = "") -> None:
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "tool": "continuum-agents",
        "command": command,
        "mode": args.mode,
        "grammar": args.grammar,
        "identity": getattr(args, "identity", "ids"),
        "concurrency": args.concurrency,
        "step_limit": args.step_limit,
        "temperature": args.temperature,
        "runs": runs,
    }
    (out / "report.json").write_text(json.dumps(report, indent=2))
    lines = [
        "# continuum-agents",
        "",
        *([f"Command: `{command}`", ""] if command else []),
        f"mini-swe-agent 2.4.6 ({args.mode} mode{', grammar-forced commands' if args.grammar else ''}, "
        f"temperature {args.temperature:g}), "
        f"concurrency {args.concurrency}, step limit {args.step_limit}.",
        "",
        "| run | tasks ended | mean JCT (s) | max JCT (s) | makespan (s) | mean steps | cached fraction, later turns | tool calls | mean tool time (s) | pins left |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        s = run["summary"]
        lines.append(
            f"| {run['label']} | {s['ended']}/{s['tasks']} | {s['mean_jct_s']:.1f} | {s['max_jct_s']:.1f} | "
            f"{s['makespan_s']:.1f} | {s['mean_steps']:.1f} | {s['later_turn_cached_fraction']:.3f} | "
            f"{s['tool_calls']} | {s['mean_tool_s']:.3f} | {s['pins_left_at_end']:.0f} |"
        )
    lines += identity_section(runs)
    lines += [
        "",
        "Per task:",
        "",
        "| run | task | exit | steps | JCT (s) | commands (tool time s) |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        for t in run["tasks"]:
            cmds = "; ".join(f"`{x['command']}` ({x['tool_s']:.3f})" for x in t["turns"] if x["command"])
            lines.append(
                f"| {run['label']} | {t['task']} | {t['exit_status']} | {t['steps']} | {t['jct_s']:.1f} | {cmds} |"
            )
    (out / "report.md").write_text("\n".join(lines) + "\n")


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _num(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.2f}"


def identity_section(runs: list[dict]) -> list[str]:
    """Program identity per run: what the server was told (or inferred), and what it did with it."""
    lines = [
        "",
        "Program identity (`ids`: every request carries its task's program id as `custom_params.program_id`, "
        "`session_id` and `X-SMG-Routing-Key`, and the run ends with `/close_session`; `plain`: mini-swe-agent's "
        "stock model class, no program metadata, programs inferred by the server from the prefix). Requests per "
        "identity source are `/metrics` deltas (the most trusted source present counts); later turns are model "
        "calls after a task's first.",
        "",
        "| run | identity | model calls | requests by program_id / session_id / routing_key / inferred / none "
        "| later turns | with cached tokens | mean cached fraction | pins made | pin hits | pin expiries "
        "| mean TTL decided (s) | pins left | attribution recall | attribution precision |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        s = run["summary"]
        by = s.get("requests_by_source", {})
        sources = " / ".join(f"{by.get(k, 0.0):.0f}" for k in IDENTITY_SERIES)
        a = s.get("attribution") or {}
        lines.append(
            f"| {run['label']} | {run.get('identity', 'ids')} | {s.get('model_calls', 0)} | {sources} "
            f"| {s.get('later_turns', 0)} | {_pct(s.get('later_turns_with_cache'))} "
            f"| {s.get('later_turn_mean_cached_fraction', 0.0):.3f} | {s.get('pins_created', 0.0):.0f} "
            f"| {s.get('pin_hits', 0.0):.0f} | {s.get('pin_expiries', 0.0):.0f} | {_num(s.get('mean_ttl_s'))} "
            f"| {s['pins_left_at_end']:.0f} "
            f"| {_pct(a.get('recall'))} | {_pct(a.get('precision'))} |"
        )
    if any("attribution" in r["summary"] for r in runs):
        lines += [
            "",
            "Attribution (plain runs on a server started here, `SGLANG_CONTINUUM_ATTRIBUTION_LOG`): each request's "
            "SGLang `rid` is its response's `id`, so the client knows which task and turn it was; recall = turns "
            "after a task's first attributed to the program its previous turn was attributed to; precision = of "
            "the requests the server attributed to an earlier program, those it got right (`bench/attribution.py`).",
        ]
    return lines


def _identities(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in IDENTITIES]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"identities are {', '.join(IDENTITIES)} (comma-separated), not {text!r}")
    return names


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running server (any policy)")
    where.add_argument("--model", help="start one CPU server per --policies with this model")
    ap.add_argument("--policies", default="fcfs,continuum", help="with --model")
    ap.add_argument("--server-args", default="", help="extra flags for every server started, quoted")
    ap.add_argument("--workers", type=int, default=1, help="with --model: this many workers behind smg")
    ap.add_argument("--router-policy", default="consistent_hashing", choices=ROUTER_POLICIES)
    ap.add_argument("--tasks", type=Path, default=Path("workloads/tasks"))
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=1, help="run every task this many times")
    ap.add_argument("--mode", choices=("text", "native"), default="text")
    ap.add_argument(
        "--grammar",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="force one command per step (extra_body.ebnf; a decoding constraint, no identity)",
    )
    ap.add_argument(
        "--identity",
        type=_identities,
        default=["ids"],
        help="ids (program ids sent three ways), plain (stock mini-swe-agent, nothing sent), or both: ids,plain "
        "(with --model, each on a fresh server; with --url, one after the other on the same server)",
    )
    ap.add_argument("--plain", dest="identity", action="store_const", const=["plain"], help="= --identity plain")
    ap.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0 (greedy): every policy sees the same commands, so JCTs compare; the random model "
        "still varies its command with the history",
    )
    ap.add_argument("--step-limit", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=160, help="per turn; the tiny tokenizer is ~1 token/char")
    ap.add_argument("--command-timeout-s", type=int, default=30)
    ap.add_argument("--model-name", default="tiny", help="the name sent to the OpenAI API")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    tasks = load_tasks(args.tasks)
    runs = []
    if args.url:
        for identity in args.identity:
            label = "server" if identity == "ids" else f"server-{identity}"
            runs.append(run_fleet(args.url.rstrip("/"), tasks, args, label, plain=identity == "plain"))
    else:
        flags = ["--enable-metrics", "--enable-cache-report", *args.server_args.split()]
        if args.mode == "native" and "--tool-call-parser" not in flags:
            flags += ["--tool-call-parser", "qwen25"]
        for policy, identity in ((p, i) for p in args.policies.split(",") for i in args.identity):
            plain = identity == "plain"
            name = policy if identity == "ids" else f"{policy}-{identity}"  # run label, file names
            log = attribution = None
            env: dict[str, str] = {}
            if args.out is not None:
                args.out.mkdir(parents=True, exist_ok=True)
                log = args.out / f"server-{name}.log"
                if plain and policy.startswith("continuum") and args.workers == 1:
                    attribution = args.out / f"attribution-{name}.jsonl"
                    attribution.unlink(missing_ok=True)
                    env["SGLANG_CONTINUUM_ATTRIBUTION_LOG"] = str(attribution.resolve())
            if args.workers > 1:
                logs = args.out / f"fleet-{name}" if args.out is not None else None
                if logs is not None:
                    logs.mkdir(parents=True, exist_ok=True)
                server_flags = ["--schedule-policy", policy, *flags]
                if "--max-total-tokens" not in flags:  # SGLang sizes each pool from free memory: N would not fit
                    server_flags += ["--max-total-tokens", "65536"]
                if "--served-model-name" not in flags:  # smg routes by model name; one server takes any
                    server_flags += ["--served-model-name", args.model_name]
                with Fleet(
                    args.model, server_flags, workers=args.workers, router_policy=args.router_policy, log_dir=logs
                ) as fleet:
                    label = f"{name}@{args.router_policy}"
                    runs.append(run_fleet(fleet.url, tasks, args, label, metrics_urls=fleet.worker_urls, plain=plain))
                continue
            with SGLangServer(args.model, ["--schedule-policy", policy, *flags], env=env, log_path=log) as server:
                runs.append(run_fleet(server.url, tasks, args, name, plain=plain, attribution_log=attribution))
    if args.out is not None:
        command = "continuum-agents " + shlex.join(argv if argv is not None else sys.argv[1:])
        write_report(args.out, runs, args, command)
        print(f"report: {args.out / 'report.md'}")
    for run in runs:
        s = run["summary"]
        by = s["requests_by_source"]
        a = s.get("attribution")
        print(
            f"{run['label']}: {s['ended']}/{s['tasks']} tasks ended, mean JCT {s['mean_jct_s']:.1f} s, "
            f"later-turn cached fraction {s['later_turn_cached_fraction']:.3f}, "
            f"pins {s['pins_created']:.0f} made / {s['pin_hits']:.0f} hit, pins left {s['pins_left_at_end']:.0f}, "
            f"requests by source {', '.join(f'{k} {v:.0f}' for k, v in by.items() if v)}"
            + (f", attribution recall {_pct(a['recall'])} precision {_pct(a['precision'])}" if a else "")
        )
    ok = all(r["summary"]["ended"] == r["summary"]["tasks"] for r in runs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
