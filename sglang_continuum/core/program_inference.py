"""Program identity inferred from the prefix, for requests that carry no id at all.

An agent's next turn re-sends its whole context: the previous turn's prompt, the previous turn's
output (re-rendered by the chat template as the assistant message) and what the tool and the
agent appended. So when a turn of a program finishes (and is not its last), this index records
two fingerprints of its context ``C`` (prompt ``Lp`` tokens + output, ``L`` tokens in all):

* the *deep key*: ``C[:max(Lp + 1, L - D)]``, the context up to ``D`` tokens before its end
  (``D`` = ``divergence_tokens``: a template may render the end of the assistant message
  differently from the generated ids -- an end-of-turn token, trailing whitespace);
* the *prompt key*: ``C[:Lp]``, the previous prompt alone, for templates that re-render the whole
  assistant message differently (stripped reasoning, re-tokenised text): divergence anywhere in
  the previous output.

A new request with no id whose prompt strictly extends a recorded key continues that program; the
deepest matching key wins (so of two programs that forked from one prompt, the one whose output
the request continues). Where the deepest match is two live programs' (forks whose outputs the
template re-rendered alike, best-of-N), the request is no one's: a guess would cross their pins
and tool samples. A program's keys are dropped when one of its turns is attributed (the next
finished turn records new ones), when the caller says the program is gone (``alive``), and oldest
first past ``max_programs``.

Fingerprints are keyed 64-bit hashes of token prefixes, ``sum (t_j + 1) K_j mod 2^64`` with a
secret random odd ``K_j`` per position (drawn per index from the OS's entropy): one vectorised pass
gives every prefix's hash, and a client who cannot read the keys cannot craft two prompts that
collide (two given prefixes collide with probability at most 2^-45 for ids below 2^18; with a
public base ``K_j = R^j``, a Thue-Morse pair of two ids collides for every odd ``R``). A lookup probes only plausible
continuation lengths: a key is filed under its length rounded down to a multiple of ``block``
tokens (and the hash there), and a prompt of ``n`` tokens probes the block lengths in
``[n - max_append_tokens, n)``, then checks the exact length and hash of what it found. So an
arrival costs O(n) numpy once (zero-copy over SGLang's ``array('q')`` ids) plus at most
``max_append_tokens / block`` dict probes, whatever the number of recorded programs; a
continuation that appends more than ``max_append_tokens`` at once is not recognised (it is served
as a new program). A collision or a wrong guess attributes a turn to the wrong program; its pin is
an ordinary pin under the same budget and shedding rules, so it costs at most a pin's worth of
memory for a TTL. A ``salt`` (one per scope, ``adapter/inference.py``) is added to every
fingerprint a record files and a lookup probes: records of two scopes never match each other, and
one scope's records never crowd another's keys. Pure: no SGLang, no torch.
"""

from __future__ import annotations

import itertools
from typing import Callable, Iterable, Optional, Sequence

import numpy as np

_ONE = np.uint64(1)
_MASK = (1 << 64) - 1
DIVERGENCE_TOKENS = 32
MAX_APPEND_TOKENS = 32_768  # what a continuation may append at once (tool output, the agent's text)
BLOCK_TOKENS = 64
MAX_PROGRAMS = 100_000
# programs kept per exact key: two live ones make it no one's, so a third can only be a tie-break
# the lookup never makes, and a bound here bounds the work of every arrival that reaches the key
PROGRAMS_PER_KEY = 2

Key = tuple[int, int]  # (prefix length, hash of that prefix)
_LENGTH_SHIFT = np.uint64(40)  # a block code: the length in the top 24 bits, the hash's top 40 below


def _code(length: int, h: int) -> int:
    return (length << 40) | (h >> 24)


def _codes(lengths: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    return (lengths.astype(np.uint64) << _LENGTH_SHIFT) | (hashes >> np.uint64(24))


def _present(sorted_codes: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Which of ``codes`` are in ``sorted_codes`` (ascending), as a mask."""
    if sorted_codes.size == 0:
        return np.zeros(codes.shape, dtype=bool)
    slots = np.minimum(np.searchsorted(sorted_codes, codes), sorted_codes.size - 1)
    return sorted_codes[slots] == codes


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
    ``tokens[:i + 1]``. Two sequences with the same first ``l`` ids have equal hashes at ``l - 1``.
    ``seed``: the keys' seed (None: the OS's entropy; tests and the lab may fix it)."""

    def __init__(self, seed: Optional[int] = None) -> None:
        self._rng = np.random.default_rng(seed)
        self._keys = np.empty(0, dtype=np.uint64)
        self._scratch = np.empty(0, dtype=np.uint64)  # reused: a lookup allocates nothing

    def _keys_upto(self, n: int) -> np.ndarray:
        if len(self._keys) < n:  # extended, never redrawn: a recorded prefix keeps its hash
            more = self._rng.integers(0, 1 << 64, max(n, 2 * len(self._keys)) - len(self._keys), dtype=np.uint64)
            self._keys = np.concatenate([self._keys, more | _ONE])  # odd: every position counts mod 2^64
        return self._keys[:n]

    def hashes(self, tokens: Sequence[int], n: int, salt: int = 0) -> np.ndarray:
        """The prefix hashes plus ``salt`` (mod 2^64), in a buffer the next call overwrites (copy
        what must outlive it)."""
        ids = _as_uint64(tokens, n)
        keys = self._keys_upto(n)
        if len(self._scratch) < n:
            self._scratch = np.empty(max(n, 2 * len(self._scratch)), dtype=np.uint64)
        out = self._scratch[:n]
        with np.errstate(over="ignore"):
            np.add(ids, _ONE, out=out)
            np.multiply(out, keys, out=out)
            np.cumsum(out, out=out)
            if salt:
                np.add(out, np.uint64(salt & _MASK), out=out)
            return out

    def key(self, tokens: Sequence[int], length: int) -> Key:
        return (length, int(self.hashes(tokens, length)[length - 1]))


class ProgramIndex:
    """Where finished turns' contexts ended -> the program that will continue them."""

    def __init__(
        self,
        *,
        divergence_tokens: int = DIVERGENCE_TOKENS,
        max_programs: int = MAX_PROGRAMS,
        max_append_tokens: int = MAX_APPEND_TOKENS,
        block: int = BLOCK_TOKENS,
        prefix: str = "inferred-",
    ) -> None:
        if divergence_tokens < 0 or max_programs < 1 or max_append_tokens < 1 or block < 1:
            raise ValueError("need divergence_tokens >= 0, max_programs >= 1, max_append_tokens >= 1, block >= 1")
        self.divergence_tokens = divergence_tokens
        self.max_programs = max_programs
        self.max_append_tokens = max_append_tokens
        self.block = block
        self.prefix = prefix
        self.hasher = PrefixHasher()
        # exact key -> the programs recorded there, oldest first, at most PROGRAMS_PER_KEY
        self._by_key: dict[Key, list[str]] = {}
        # program -> its exact keys (one or two), oldest record first
        self._keys: dict[str, tuple[Key, ...]] = {}
        # exact key -> the block it is filed under; block key -> how many exact keys are filed there
        self._block_of: dict[Key, Key] = {}
        self._blocks: dict[Key, int] = {}
        # the block keys and the exact keys as sortable integers, ascending (length first): a
        # prompt's probes, made in ascending length, are one vectorised search each; only what is
        # found reaches the dicts
        self._sorted = np.empty(0, dtype=np.uint64)
        self._sorted_keys = np.empty(0, dtype=np.uint64)
        self._ids = itertools.count(1)
        self.created = 0  # inferred programs started
        self.attributed = 0  # requests attributed to a recorded program
        self.ambiguous = 0  # requests whose deepest match was two live programs' (no one's)
        self.dropped = 0  # programs' keys dropped by the bound
        self.crowded = 0  # keys given up to newer programs recorded at the same key

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, program_id: str) -> bool:
        return program_id in self._keys

    def new_program(self) -> str:
        """The id of a new inferred program (unique for this index's life)."""
        self.created += 1
        return f"{self.prefix}{next(self._ids)}"

    def _filed_at(self, length: int) -> int:
        return length - length % self.block if length >= self.block else length

    def record(
        self, program_id: str, context: Sequence[int], prompt_tokens: int, context_tokens: int, *, salt: int = 0
    ) -> None:
        """A non-final turn of ``program_id`` finished: its context is ``context[:context_tokens]``,
        of which the first ``prompt_tokens`` were its prompt. Replaces the program's earlier keys.
        Only a lookup with the same ``salt`` finds them."""
        if not 0 < prompt_tokens <= context_tokens <= len(context):
            raise ValueError(f"bad lengths: prompt {prompt_tokens}, context {context_tokens} of {len(context)}")
        self.forget(program_id)
        deep = max(prompt_tokens + 1, context_tokens - self.divergence_tokens)
        hashes = self.hasher.hashes(context, context_tokens, salt)
        lengths = [prompt_tokens] + ([deep] if deep <= context_tokens else [])
        keys = tuple((n, int(hashes[n - 1])) for n in lengths)
        for key in keys:
            block = (self._filed_at(key[0]), int(hashes[self._filed_at(key[0]) - 1]))
            programs = self._by_key.get(key)
            if programs is None:
                programs = self._by_key[key] = []
                self._add_code(key, block)
            programs.append(program_id)
            if len(programs) > PROGRAMS_PER_KEY:
                # the key is ambiguous while two of its newest are alive: an older one's entry
                # there can only ever lose to them, and keeping it would make every arrival that
                # reaches this key walk all of them (one shared prompt, many single requests)
                self._drop_key(programs[0], key)
                self.crowded += 1
        self._keys[program_id] = keys
        while len(self._keys) > self.max_programs:
            self.forget(next(iter(self._keys)))
            self.dropped += 1

    def match(
        self, prompt: Sequence[int], alive: Callable[[str], bool] = lambda pid: True, *, salt: int = 0
    ) -> Optional[str]:
        """The program whose recorded context ``prompt`` strictly extends (deepest key first, among
        those recorded with ``salt``), its keys consumed; None if there is none, or if the deepest is
        two live programs' (ambiguous).
        Programs for which ``alive`` is false are forgotten on the way. Bounded whatever is
        recorded: the hashes of the prompt, one vectorised search over at most
        ``max_append_tokens / block`` block lengths plus one over the lengths of the blocks found,
        and ``PROGRAMS_PER_KEY`` programs weighed per key found."""
        n = len(prompt)
        if n < 2 or not self._blocks:
            return None
        low = max(1, n - self.max_append_tokens)
        small = range(low, min(n, self.block))  # keys shorter than a block are filed at their length
        blocks = range(max(self.block, low - low % self.block), n, self.block)  # the block holding ``low`` too
        lengths = np.fromiter(itertools.chain(small, blocks), dtype=np.int64)
        if lengths.size == 0:
            return None
        hashes = self.hasher.hashes(prompt, n - 1, salt)  # a key must be strictly extended: length <= n - 1
        found = lengths[_present(self._sorted, _codes(lengths, hashes[lengths - 1]))]
        if found.size == 0:
            return None
        # every length a key filed in a found block can have, below n, deepest first
        span = np.where(found >= self.block, self.block, 1)
        offsets = np.arange(self.block, dtype=np.int64)
        within = (found[:, None] + offsets[None, :])[(offsets[None, :] < span[:, None])]
        within = within[(within >= low) & (within <= n - 1)][::-1]
        at = hashes[within - 1]
        exact = np.flatnonzero(_present(self._sorted_keys, _codes(within, at)))
        for length, h in zip(within[exact].tolist(), at[exact].tolist()):
            live = []
            for pid in list(self._by_key.get((length, h), ())):
                if alive(pid):
                    live.append(pid)
                else:
                    self.forget(pid)  # ended or forgotten by the registry: its context is no one's now
            if len(live) == 1:
                self.forget(live[0])
                self.attributed += 1
                return live[0]
            if len(live) > 1:
                self.ambiguous += 1
                return None
        return None

    def forget(self, program_id: str) -> None:
        for key in self._keys.get(program_id, ()):
            self._drop_key(program_id, key)

    def _drop_key(self, program_id: str, key: Key) -> None:
        """``program_id``'s entry at ``key`` goes; a program left with no key is forgotten."""
        programs = self._by_key[key]
        programs.remove(program_id)
        if not programs:
            del self._by_key[key]
            self._remove_code(key)
        keys = tuple(k for k in self._keys[program_id] if k != key)
        if keys:
            self._keys[program_id] = keys
        else:
            del self._keys[program_id]

    def _add_code(self, key: Key, block: Key) -> None:
        self._block_of[key] = block
        code = _code(*key)
        self._sorted_keys = np.insert(self._sorted_keys, np.searchsorted(self._sorted_keys, code), code)
        count = self._blocks.get(block, 0)
        self._blocks[block] = count + 1
        if count == 0:
            code = _code(*block)
            self._sorted = np.insert(self._sorted, np.searchsorted(self._sorted, code), code)

    def _remove_code(self, key: Key) -> None:
        self._sorted_keys = np.delete(self._sorted_keys, np.searchsorted(self._sorted_keys, _code(*key)))
        block = self._block_of.pop(key)
        count = self._blocks[block] - 1
        if count:
            self._blocks[block] = count
        else:
            del self._blocks[block]
            self._sorted = np.delete(self._sorted, np.searchsorted(self._sorted, _code(*block)))

    def forget_all(self, program_ids: Iterable[str]) -> None:
        for pid in program_ids:
            self.forget(pid)

    def check_integrity(self) -> None:
        assert len(self._keys) <= self.max_programs, "index over its bound"
        for pid, keys in self._keys.items():
            assert 1 <= len(keys) <= 2 and len(set(keys)) == len(keys), f"{pid} has keys {keys}"
            assert all(pid in self._by_key[k] for k in keys), f"{pid} missing at one of its keys"
        for key, programs in self._by_key.items():
            assert 1 <= len(programs) <= PROGRAMS_PER_KEY, f"{len(programs)} programs at {key}"
            assert len(set(programs)) == len(programs), f"a program twice at {key}"
            assert all(key in self._keys[pid] for pid in programs), f"a stray program at {key}"
            assert self._block_of[key][0] == self._filed_at(key[0]), f"{key} misfiled"
        assert self._block_of.keys() == self._by_key.keys(), "block of a key out of step"
        filed: dict[Key, int] = {}
        for block in self._block_of.values():
            filed[block] = filed.get(block, 0) + 1
        assert filed == self._blocks, "block counts out of step"
        assert self._sorted.tolist() == sorted(_code(*b) for b in self._blocks), "sorted block codes out of step"
        assert self._sorted_keys.tolist() == sorted(_code(*k) for k in self._by_key), "sorted key codes out of step"
