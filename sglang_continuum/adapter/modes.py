"""The SGLang modes the binding cannot serve, refused at start-up with the flag named.

Each breaks an assumption of ``binding.py``: one scheduler loop that runs ``get_next_batch_to_run``
every step over one waiting queue, the same requests in the same order on every rank, and an
``add_one_req`` that may skip a request without side effects.
"""

from __future__ import annotations

# (server args field, value that is served, the flag, why not)
_REFUSED = (
    (
        "enable_priority_scheduling",
        False,
        "--enable-priority-scheduling",
        "SGLang's priority path re-sorts the waiting queue under Continuum's program order",
    ),
    (
        "attn_dp_size",
        1,
        "--attn-dp-size (--enable-dp-attention)",
        "data-parallel attention ranks hold different queues, and the per-step clock consensus is a collective",
    ),
    (
        "enable_prefill_delayer",
        False,
        "--enable-prefill-delayer",
        "its per-selection all_gather would be re-run on one rank when admission is retried after shedding",
    ),
    (
        "pp_size",
        1,
        "--pp-size",
        "pipeline stages each run the scheduler on their own clock and statistics, so pins could expire and turns "
        "be admitted at different steps on different stages, which must build identical batches",
    ),
    (
        "disaggregation_mode",
        "null",
        "--disaggregation-mode",
        "prefill/decode disaggregation selects batches without the step in which pins expire and are consumed",
    ),
)


def refusals(server_args, *, hybrid_ssm: bool = False) -> list[str]:
    """Why ``--schedule-policy continuum`` cannot serve with these arguments (empty: it can)."""
    out = [
        f"{flag}: {why}"
        for name, served, flag, why in _REFUSED
        if getattr(server_args, name, served) not in (served, None)
    ]
    if hybrid_ssm:
        out.append("hybrid Mamba/SSM models: a request skipped at admission keeps the state slot SGLang staged for it")
    return out


def check_supported(server_args, *, hybrid_ssm: bool = False) -> None:
    problems = refusals(server_args, hybrid_ssm=hybrid_ssm)
    if problems:
        raise RuntimeError(
            "--schedule-policy continuum does not support "
            + "; ".join(problems)
            + ". Drop the flag (or serve this model with another policy)."
        )
