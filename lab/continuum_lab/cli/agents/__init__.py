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
to (the server's ``event_log``; each request's SGLang ``rid`` is the ``id`` of its response,
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

Modules: ``tasks`` (a task, its grammar, one mini-swe-agent run and its turn records), ``fleet``
(every task against a server or a fleet behind smg; the CLI), ``report`` (summaries, attribution
score, the report files).
"""

from continuum_lab.cli.agents.fleet import main

__all__ = ["main"]
