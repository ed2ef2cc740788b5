"""The tasks and one mini-swe-agent run of a task: grammar, model classes (ids or stock), turn records."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from sglang_continuum.core.series import series_key, series_name
from sglang_continuum.core.tool_calls import SUBMIT_SENTINELS, command_tool

SUBMIT_COMMAND = f"echo {SUBMIT_SENTINELS[0]}"
ENDED_OK = {"Submitted", "LimitsExceeded"}  # a task "ended" by submit or by its step limit
IDENTITIES = ("ids", "plain")  # program ids sent three ways | stock mini-swe-agent, nothing sent
# where each request's program id came from, as /metrics counts it (docs/program-identity.md)
IDENTITY_SERIES = {
    source: series_key(f"identity.{source}")
    for source in ("program_id", "session_id", "routing_key", "inferred", "first_turn", "none")
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
