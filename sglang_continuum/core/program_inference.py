"""Program identity inferred from the prefix, for requests that carry no id at all.

An agent's next turn re-sends its whole context: the previous turn's prompt, the previous turn's
output (re-rendered by the chat template as the assistant message) and what the tool and the
agent appended. So when a turn of a program finishes (and is not its last), this index records
two fingerprints of its context ``C`` (prompt ``Lp`` tokens + output, ``L`` tokens in all):

* the *deep key*: ``C[:max(Lp + 1, L - D)]``, the context up to ``D`` tokens before its end
  (``D`` = ``infer_divergence_tokens``: a template may render the end of the assistant message
  differently from the generated ids -- an end-of-turn token, trailing whitespace);
* the *prompt key*: ``C[:Lp]``, the previous prompt alone, for templates that re-render the whole
  assistant message differently (stripped reasoning, re-tokenised text): divergence anywhere in
  the previous output.

A new request with no id whose prompt strictly extends a recorded key continues that program; the
deepest matching key wins (so of two programs that forked from one prompt, the one whose output
the request continues). A request that matches nothing starts a new inferred program. A program's
keys are dropped when one of its turns is attributed (the next finished turn records new ones),
when the caller says the program is gone (``alive``), and oldest first past ``max_programs``.

Fingerprints are 64-bit polynomial hashes of token prefixes, ``sum (t_j + 1) R^j mod 2^64`` with
a fixed odd ``R``: one vectorised pass gives every prefix's hash, so a lookup costs O(prompt) once
(zero-copy over SGLang's ``array('q')`` ids) plus one dict probe per distinct recorded length
below the prompt's. A collision or a wrong guess attributes a turn to the wrong program; its pin
is an ordinary pin under the same budget and shedding rules, so it costs at most a pin's worth of
memory for a TTL. Pure: no SGLang, no torch.
"""

from __future__ import annotations

import bisect
import itertools
from typing import Callable, Iterable, Optional, Sequence

import numpy as np

_R = np.uint64(0x9E3779B97F4A7C15)  # odd: every power is invertible mod 2^64, no power collapses to 0
_ONE = np.uint64(1)

Key = tuple[int, int]  # (prefix length, hash of that prefix)


def _as_uint64(tokens: Sequence[int], n: int) -> np.ndarray:
    """The first ``n`` ids as uint64, without copying SGLang's ``array('q')``."""
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    try:
        view = np.frombuffer(tokens, dtype=np.int64, count=n)  # array('q'), bytes-like int64
    except (TypeError, ValueError):
        view = np.fromiter(itertools.islice(tokens, n), dtype=np.int64, count=n)
    return view.view(np.uint64)


class PrefixHasher:
    """Hashes of every prefix of a token sequence: ``hashes(tokens, n)[i]`` fingerprints
    ``tokens[:i + 1]``. Two sequences with the same first ``l`` ids have equal hashes at ``l - 1``."""

    def __init__(self) -> None:
        self._powers = np.ones(1, dtype=np.uint64)

    def _powers_upto(self, n: int) -> np.ndarray:
        if len(self._powers) < n:
            size = max(n, 2 * len(self._powers))
            steps = np.full(size, _R, dtype=np.uint64)
            steps[0] = _ONE
            self._powers = np.cumprod(steps, dtype=np.uint64)
        return self._powers[:n]

    def hashes(self, tokens: Sequence[int], n: int) -> np.ndarray:
        ids = _as_uint64(tokens, n)
        with np.errstate(over="ignore"):
            return np.cumsum((ids + _ONE) * self._powers_upto(n), dtype=np.uint64)

    def key(self, tokens: Sequence[int], length: int) -> Key:
        return (length, int(self.hashes(tokens, length)[length - 1]))


class ProgramIndex:
    """Where finished turns' contexts ended -> the program that will continue them."""

    def __init__(self, *, divergence_tokens: int = 32, max_programs: int = 100_000, prefix: str = "inferred-") -> None:
        if divergence_tokens < 0 or max_programs < 1:
            raise ValueError("divergence_tokens must be >= 0 and max_programs >= 1")
        self.divergence_tokens = divergence_tokens
        self.max_programs = max_programs
        self.prefix = prefix
        self.hasher = PrefixHasher()
        self._by_key: dict[Key, dict[str, None]] = {}  # key -> programs recorded there, oldest first
        self._keys: dict[str, tuple[Key, ...]] = {}  # program -> its keys, oldest record first
        self._length_refs: dict[int, int] = {}  # recorded prefix length -> number of keys of that length
        self._lengths: list[int] = []  # the distinct recorded lengths, ascending
        self._ids = itertools.count(1)
        self.created = 0  # inferred programs started
        self.attributed = 0  # requests attributed to a recorded program
        self.dropped = 0  # programs' keys dropped by the bound

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, program_id: str) -> bool:
        return program_id in self._keys

    def new_program(self) -> str:
        """The id of a new inferred program (unique for this index's life)."""
        self.created += 1
        return f"{self.prefix}{next(self._ids)}"

    def record(self, program_id: str, context: Sequence[int], prompt_tokens: int, context_tokens: int) -> None:
        """A non-final turn of ``program_id`` finished: its context is ``context[:context_tokens]``,
        of which the first ``prompt_tokens`` were its prompt. Replaces the program's earlier keys."""
        if not 0 < prompt_tokens <= context_tokens <= len(context):
            raise ValueError(f"bad lengths: prompt {prompt_tokens}, context {context_tokens} of {len(context)}")
        self.forget(program_id)
        deep = max(prompt_tokens + 1, context_tokens - self.divergence_tokens)
        hashes = self.hasher.hashes(context, context_tokens)
        keys = [(prompt_tokens, int(hashes[prompt_tokens - 1]))]
        if deep <= context_tokens:
            keys.append((deep, int(hashes[deep - 1])))
        for key in keys:
            self._by_key.setdefault(key, {})[program_id] = None
            refs = self._length_refs.get(key[0], 0)
            if refs == 0:
                bisect.insort(self._lengths, key[0])
            self._length_refs[key[0]] = refs + 1
        self._keys[program_id] = tuple(keys)
        while len(self._keys) > self.max_programs:
            self.forget(next(iter(self._keys)))
            self.dropped += 1

    def match(self, prompt: Sequence[int], alive: Callable[[str], bool] = lambda pid: True) -> Optional[str]:
        """The program whose recorded context ``prompt`` strictly extends (deepest key first; among
        programs recorded at one key, the latest), its keys consumed; None if there is none.
        Programs for which ``alive`` is false are forgotten on the way."""
        n = len(prompt)
        top = bisect.bisect_left(self._lengths, n)  # lengths < n: the prompt must extend the key
        if top == 0:
            return None
        hashes = self.hasher.hashes(prompt, self._lengths[top - 1])
        for length in reversed(self._lengths[:top]):
            programs = self._by_key.get((length, int(hashes[length - 1])))
            while programs:
                pid = next(reversed(programs))
                if alive(pid):
                    self.forget(pid)
                    self.attributed += 1
                    return pid
                self.forget(pid)  # ended or forgotten by the registry: its context is no one's now
        return None

    def forget(self, program_id: str) -> None:
        for key in self._keys.pop(program_id, ()):
            programs = self._by_key[key]
            del programs[program_id]
            if not programs:
                del self._by_key[key]
            refs = self._length_refs[key[0]] - 1
            if refs:
                self._length_refs[key[0]] = refs
            else:
                del self._length_refs[key[0]]
                del self._lengths[bisect.bisect_left(self._lengths, key[0])]

    def forget_all(self, program_ids: Iterable[str]) -> None:
        for pid in program_ids:
            self.forget(pid)

    def check_integrity(self) -> None:
        assert len(self._keys) <= self.max_programs, "index over its bound"
        counted: dict[int, int] = {}
        for pid, keys in self._keys.items():
            assert 1 <= len(keys) <= 2, f"{pid} has {len(keys)} keys"
            for key in keys:
                assert pid in self._by_key.get(key, {}), f"{pid}'s key {key} not indexed"
                counted[key[0]] = counted.get(key[0], 0) + 1
        assert sum(len(p) for p in self._by_key.values()) == sum(len(k) for k in self._keys.values()), "stray keys"
        assert counted == self._length_refs, "length counts"
        assert self._lengths == sorted(counted), "length list"
