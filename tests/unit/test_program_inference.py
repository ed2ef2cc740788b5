"""Program identity from the prefix: the pure index (core/program_inference.py)."""

import random
from array import array

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_continuum.core.program_inference import PROGRAMS_PER_KEY, PrefixHasher, ProgramIndex


def ids(rng, n):
    return [rng.randrange(5, 50_000) for _ in range(n)]


def finished(index, pid, prompt, output):
    index.record(pid, prompt + output, len(prompt), len(prompt) + len(output))
    return prompt + output


def test_prefix_hashes_agree_for_lists_and_sglang_arrays_and_tell_prefixes_apart():
    rng = random.Random(0)
    a = ids(rng, 300)
    b = a[:200] + ids(rng, 100)
    h = PrefixHasher()
    ha, hb, harr = h.hashes(a, 300).copy(), h.hashes(b, 300).copy(), h.hashes(array("q", a), 300).copy()
    assert (ha == harr).all()
    assert (ha[:200] == hb[:200]).all() and not (ha[200:] == hb[200:]).any()
    assert h.key([0, 0], 2) != h.key([0, 0, 0], 3)  # token 0 still counts


def test_next_turn_continues_the_program_and_consumes_its_keys():
    rng = random.Random(1)
    index = ProgramIndex(divergence_tokens=8)
    ctx = finished(index, "p", ids(rng, 100), ids(rng, 20))
    assert index.match(ctx + ids(rng, 30)) == "p"
    assert len(index) == 0 and index.match(ctx + ids(rng, 30)) is None  # consumed: the next finish re-records
    index.check_integrity()


def test_a_prompt_that_does_not_extend_a_context_is_no_ones():
    rng = random.Random(2)
    index = ProgramIndex()
    prompt = ids(rng, 100)
    finished(index, "p", prompt, ids(rng, 20))
    assert index.match(prompt) is None  # a retry of the same turn is not its next turn
    assert index.match(prompt[:50]) is None
    assert index.match(ids(rng, 200)) is None
    assert index.match(prompt[:99] + ids(rng, 60)) is None  # diverges inside the previous prompt
    assert "p" in index


@pytest.mark.parametrize("divergence", [0, 1, 8])
def test_a_re_rendered_end_of_the_output_within_d_still_matches(divergence):
    rng = random.Random(3)
    index = ProgramIndex(divergence_tokens=8)
    prompt, out = ids(rng, 100), ids(rng, 40)
    finished(index, "p", prompt, out)
    rerendered = out[: len(out) - divergence] + ids(rng, divergence)
    assert index.match(prompt + rerendered + ids(rng, 10)) == "p"


def test_a_wholly_re_rendered_output_matches_by_the_prompt_key():
    rng = random.Random(4)
    index = ProgramIndex(divergence_tokens=8)
    prompt = ids(rng, 100)
    finished(index, "p", prompt, ids(rng, 40))
    assert index.match(prompt + ids(rng, 25)) == "p"  # reasoning stripped from the history, say


def test_of_two_programs_forked_from_one_prompt_the_one_whose_output_is_continued_wins():
    rng = random.Random(5)
    index = ProgramIndex(divergence_tokens=4)
    prompt = ids(rng, 100)
    ctx_a = finished(index, "a", prompt, ids(rng, 30))
    ctx_b = finished(index, "b", prompt, ids(rng, 30))
    assert index.match(ctx_a + ids(rng, 5)) == "a"
    assert index.match(ctx_b + ids(rng, 5)) == "b"


def test_programs_that_are_gone_are_skipped_and_forgotten():
    rng = random.Random(6)
    index = ProgramIndex()
    prompt = ids(rng, 50)
    ctx = finished(index, "old", prompt, ids(rng, 10))
    assert index.match(ctx + [7], alive=lambda pid: pid != "old") is None
    assert "old" not in index
    index.check_integrity()


def test_the_index_is_bounded_oldest_first():
    rng = random.Random(7)
    index = ProgramIndex(max_programs=3)
    contexts = [finished(index, f"p{i}", ids(rng, 20), ids(rng, 5)) for i in range(5)]
    assert len(index) == 3 and index.dropped == 2
    assert index.match(contexts[0] + [9]) is None and index.match(contexts[4] + [9]) == "p4"
    index.check_integrity()


def test_recording_again_replaces_a_programs_keys():
    rng = random.Random(8)
    index = ProgramIndex()
    first = finished(index, "p", ids(rng, 30), ids(rng, 5))
    second = finished(index, "p", first + ids(rng, 10), ids(rng, 5))
    assert index.match(first + ids(rng, 3)) is None
    assert index.match(second + ids(rng, 3)) == "p"


def test_bad_lengths_are_refused():
    with pytest.raises(ValueError):
        ProgramIndex().record("p", [1, 2, 3], 0, 3)
    with pytest.raises(ValueError):
        ProgramIndex().record("p", [1, 2, 3], 2, 4)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["finish", "next", "stranger", "forget"]), st.integers(0, 5), st.integers(1, 40)),
        max_size=40,
    ),
    st.integers(0, 16),
)
def test_programs_are_followed_through_random_interleavings(ops, divergence):
    """Six programs with disjoint histories, turns finishing and returning in any order: every
    returning turn is attributed to its own program, strangers to none."""
    rng = random.Random(9)
    index = ProgramIndex(divergence_tokens=divergence, max_programs=4)
    contexts = {f"p{i}": [1000 * (i + 1)] + ids(rng, 10) for i in range(6)}
    recorded: set[str] = set()
    for op, i, n in ops:
        pid = f"p{i}"
        if op == "finish":
            prompt = contexts[pid]
            contexts[pid] = finished(index, pid, prompt, ids(rng, n))
            recorded.add(pid)
        elif op == "next":
            got = index.match(contexts[pid] + ids(rng, n))
            if got is not None:
                assert got == pid
                recorded.discard(pid)
            else:
                assert pid not in index  # never recorded, consumed, or dropped by the bound
        elif op == "stranger":
            assert index.match([7] + ids(rng, n)) is None
        else:
            index.forget(pid)
        index.check_integrity()
        assert set(index._keys) <= recorded


def test_forks_whose_outputs_were_re_rendered_alike_are_no_ones():
    # best-of-N, RL rollouts: two programs from one prompt; the template re-renders their outputs
    # (deep keys miss), so only the shared prompt key matches: a guess would cross their pins
    rng = random.Random(10)
    index = ProgramIndex(divergence_tokens=4)
    prompt = ids(rng, 100)
    finished(index, "a", prompt, ids(rng, 30))
    finished(index, "b", prompt, ids(rng, 30))
    assert index.match(prompt + ids(rng, 40)) is None and index.ambiguous == 1
    assert "a" in index and "b" in index  # neither consumed
    assert index.match(prompt + ids(rng, 40), alive=lambda pid: pid == "b") == "b"  # a ended: b's alone
    index.check_integrity()


def test_a_shared_system_prompt_is_not_a_continuation():
    # agents of one kind share a long system prompt; a new program's first turn shares its first
    # block-aligned tokens with a recorded prompt but not the recorded prompt itself
    rng = random.Random(11)
    index = ProgramIndex(divergence_tokens=8)
    system = ids(rng, 960)
    finished(index, "a", system + ids(rng, 40), ids(rng, 30))  # a's prompt: system + its task
    assert index.match(system + ids(rng, 300)) is None  # another task after the same system prompt
    index.check_integrity()


def test_a_lookup_probes_only_plausible_lengths_whatever_is_recorded():
    """The cost of an arrival is bounded by the continuation window, not by the records: 30,000
    recorded programs, and a prompt probes at most max_append / block block lengths (plus the
    lengths below one block). Timings: ``continuum-overhead --inference``."""

    class Counted(dict):
        probes = 0

        def get(self, key, default=None):
            Counted.probes += 1
            return super().get(key, default)

    rng = np.random.default_rng(12)
    index = ProgramIndex(max_append_tokens=4096, block=64)
    for i in range(30_000):  # every recorded length within the window of the prompts below
        n = int(rng.integers(200, 4_000))
        index.record(f"p{i}", rng.integers(5, 50_000, n), n - 100, n)
    index._by_key = Counted(index._by_key)
    stranger = rng.integers(5, 50_000, 4_096)
    assert index.match(stranger) is None
    assert Counted.probes <= 4096 // 64 + 64
    continued = rng.integers(5, 50_000, 3_000)
    index.record("mine", continued, 2_900, 3_000)
    Counted.probes = 0
    assert index.match(np.concatenate([continued, rng.integers(5, 50_000, 1_000)])) == "mine"
    assert Counted.probes <= 4096 // 64 + 64


def test_a_continuation_past_the_window_is_served_as_a_new_program():
    rng = random.Random(13)
    index = ProgramIndex(max_append_tokens=256, block=64)
    ctx = finished(index, "p", ids(rng, 300), ids(rng, 20))
    assert index.match(ctx + ids(rng, 200)) == "p"
    ctx = finished(index, "p", ctx + ids(rng, 200), ids(rng, 20))
    assert index.match(ctx + ids(rng, 600)) is None  # appended more than the window at once


def test_an_arrival_weighs_a_bounded_number_of_programs_whatever_shares_its_prompt():
    """One shared prompt, many single requests (load tests, n-sample evals): every record files
    under the same keys. An arrival that reaches them weighs at most ``PROGRAMS_PER_KEY`` programs
    per key, not every record (it asked ``alive`` of each of 5,000 before the bound)."""
    rng = random.Random(14)
    index = ProgramIndex(divergence_tokens=32)
    prompt = ids(rng, 128)
    output = ids(rng, 40)  # greedy decoding: the same output every time
    for i in range(5_000):
        index.record(f"p{i}", prompt + output, len(prompt), len(prompt) + len(output))
    index.check_integrity()
    asked = []

    def alive(pid: str) -> bool:
        asked.append(pid)
        return True

    assert index.match(prompt + output + ids(rng, 10), alive) is None  # two live at the deepest: no one's
    assert len(asked) <= 2 * PROGRAMS_PER_KEY and index.ambiguous == 1
    assert index.crowded == 2 * (5_000 - PROGRAMS_PER_KEY)
    # the newest two are kept; once one of them has ended the other is the continuation
    assert index.match(prompt + output + ids(rng, 10), alive=lambda pid: pid == "p4999") == "p4999"
    index.check_integrity()


def test_a_program_crowded_out_of_its_prompt_key_keeps_its_own_deep_key():
    rng = random.Random(15)
    index = ProgramIndex(divergence_tokens=8)
    prompt = ids(rng, 100)
    mine = prompt + ids(rng, 60)
    index.record("mine", mine, len(prompt), len(mine))
    for i in range(10):  # others after the same prompt, other outputs
        other = prompt + ids(rng, 60)
        index.record(f"o{i}", other, len(prompt), len(other))
    assert "mine" in index  # its prompt key went to newer programs, its deep key is its own
    assert index.match(mine + ids(rng, 20)) == "mine"
    index.check_integrity()


def test_a_salted_record_is_found_only_under_its_own_salt_and_crowds_only_its_own_keys():
    """Scopes (``program_scope_header``) salt their fingerprints: tenant B sending A's very context
    neither joins A's program nor pushes A's entries out of a shared prompt's keys."""
    rng = random.Random(16)
    index = ProgramIndex(divergence_tokens=8)
    prompt, output = ids(rng, 100), ids(rng, 20)
    index.record("a", prompt + output, len(prompt), len(prompt) + len(output), salt=0xA)
    for i in range(2 * PROGRAMS_PER_KEY):  # B records the same context again and again
        index.record(f"b{i}", prompt + output, len(prompt), len(prompt) + len(output), salt=0xB)
    index.check_integrity()
    assert index.crowded == 2 * PROGRAMS_PER_KEY  # B's own, not A's
    nxt = prompt + output + ids(rng, 10)
    assert index.match(nxt) is None  # unscoped: nothing recorded there
    assert index.match(nxt, alive=lambda pid: pid == f"b{2 * PROGRAMS_PER_KEY - 1}", salt=0xB).startswith("b")
    assert index.match(nxt, salt=0xA) == "a"
    index.check_integrity()


def test_salts_wrap_around_the_64_bit_fingerprints():
    h = PrefixHasher()
    tokens = list(range(10, 40))
    plain = h.hashes(tokens, 30).copy()
    salted = h.hashes(tokens, 30, (1 << 64) - 1)  # + (2^64 - 1) is - 1 mod 2^64
    with np.errstate(over="ignore"):
        assert (salted == plain - np.uint64(1)).all()


def _thue_morse(a: int, b: int, n: int) -> list[int]:
    return [b if bin(i).count("1") % 2 else a for i in range(n)]


def test_a_thue_morse_pair_that_collides_under_any_public_odd_base_is_told_apart():
    """A polynomial hash mod 2^64 with a public odd base R maps the Thue-Morse word over two ids and
    its complement to one fingerprint (their difference is (a - b) * prod (1 - R^(2^i)), divisible
    by 2^64 from 2^11 ids on), so a client could send one program's context under another's. The
    keys are secret per position: the two differ, and the index keeps them apart."""
    n = 2048
    first, second = _thue_morse(7, 9, n), _thue_morse(9, 7, n)
    r = 0x9E3779B97F4A7C15
    public = [sum((t + 1) * pow(r, j, 1 << 64) for j, t in enumerate(w)) % (1 << 64) for w in (first, second)]
    assert public[0] == public[1]  # the attack is real against a public base
    index = ProgramIndex(divergence_tokens=0)
    index.record("victim", first, n - 16, n)
    assert index.match(second + [5] * 10) is None
    assert index.match(first + [5] * 10) == "victim"
    index.check_integrity()
    for seed in range(4):
        h = PrefixHasher(seed)
        assert h.key(first, n) != h.key(second, n)


def test_a_hashers_keys_are_extended_never_redrawn():
    h = PrefixHasher(3)
    tokens = list(range(1, 101))
    short = h.hashes(tokens, 10).copy()
    h.hashes(list(range(5000)), 5000)  # grows the keys
    assert (h.hashes(tokens, 10) == short).all()
    assert (PrefixHasher(3).hashes(tokens, 100) == h.hashes(tokens, 100)).all()
