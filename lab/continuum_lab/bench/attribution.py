"""How well the server inferred programs for a replay that sent no ids (``continuum-bench --no-ids``).

The server writes, per request with no id, the program it attributed the request to (its
``event_log``: ``{"event": "attributed", "rid", "program_id", "source"}``; ``source`` is
``inferred`` for a continuation found by prefix, ``first_turn`` or ``none`` for a new id: a program from its
first turn, or provisional until a continuation makes it one). The replay names each request
``<program>#<turn>`` (SGLang's ``rid``), so the truth is known: turn ``i >= 1`` of a program is
attributed right when it continues the program its turn ``i - 1`` was attributed to.

* recall = turns after the first attributed right / turns after the first;
* precision = turns attributed right / requests the server attributed to an earlier program.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional

from continuum_lab.bench.events import read_attributions


def turn_rid(program_id: str, turn: int) -> str:
    return f"{program_id}#{turn}"


def retry_rid(program_id: str, turn: int, retry: int) -> str:
    """The rid of a turn's ``retry``-th resend after a client timeout (its ``turn_rid`` for the
    first try): ``<program>~r<retry>#<turn>``. SGLang aborts every request whose rid *starts with*
    the aborted one, and a disconnect's abort may reach the scheduler after the resend did: no
    resend's rid may extend an earlier try's. The scoring reads each turn's first try."""
    return turn_rid(program_id, turn) if retry == 0 else f"{program_id}~r{retry}#{turn}"


def read_log(path: Path) -> dict[str, tuple[str, str]]:
    """rid -> (program id, source); unreadable lines are skipped (a crash may cut the last one)."""
    out: dict[str, tuple[str, str]] = {}
    for row in read_attributions(path):
        try:
            out[str(row["rid"])] = (str(row["program_id"]), str(row["source"]))
        except KeyError:
            continue
    return out


def score(programs: Iterable[tuple[str, int]], log: dict[str, tuple[str, str]]) -> dict[str, Optional[float]]:
    """``programs``: (program id, turns sent) per replayed program."""
    later = right = continued = unlogged = 0
    for pid, turns in programs:
        previous = None
        for i in range(turns):
            got = log.get(turn_rid(pid, i))
            if got is None:
                unlogged += 1
                previous = None
                continue
            assigned, source = got
            if source == "inferred":
                continued += 1
            if i >= 1:
                later += 1
                right += source == "inferred" and previous is not None and assigned == previous
            previous = assigned
    return {
        "turns_after_first": later,
        "attributed_right": right,
        "attributed_to_earlier_program": continued,
        "unlogged_requests": unlogged,
        "recall": right / later if later else None,
        "precision": right / continued if continued else None,
    }
