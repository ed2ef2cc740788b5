"""Tier 2: ContinuumRadixCache on real SGLang CPU pools."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sglang.srt.mem_cache.base_prefix_cache import EvictParams

from continuum_lab.harness.cpu_cache import TurnDriver, make_cache
from sglang_continuum.core.clock import ManualClock
from sglang_continuum.core.metadata import ProgramMeta
from sglang_continuum.core.settings import ContinuumSettings
from tests.support import fixed_ttl_rules

pytestmark = pytest.mark.sglang


def continuum_cache(size=256, fixed_ttl_s=2.0, **kw):
    clock = ManualClock()
    s = ContinuumSettings(rules=fixed_ttl_rules(fixed_ttl_s), max_ttl_s=max(30.0, fixed_ttl_s), **kw)
    return make_cache(size, settings=s, clock=clock), clock


def step(cache, clock, waiting=()):
    cache.step(clock(), lambda pid: pid in waiting)


def test_pinned_prefix_survives_pressure_that_evicts_an_unpinned_one():
    cache, clock = continuum_cache(256, fixed_ttl_s=5.0)
    d = TurnDriver(cache)
    pinned = list(range(1, 101))
    unpinned = list(range(1001, 1101))
    d.run_turn(ProgramMeta("agent"), pinned)  # non-final turn -> pinned
    d.run_turn(ProgramMeta("other", is_last_step=True), unpinned)  # final turn -> evictable
    assert cache.controller.pins.pinned_tokens == 100
    assert d.fill(150) == 150  # needs memory: only the unpinned prefix may go
    assert d.cached_len(pinned) == 100
    assert d.cached_len(unpinned) < 100
    again = d.run_turn(ProgramMeta("agent", is_last_step=True), pinned + [7, 7, 7])
    assert again.cached == 100


def test_expired_pin_becomes_evictable():
    cache, clock = continuum_cache(256, fixed_ttl_s=2.0)
    d = TurnDriver(cache)
    ctx = list(range(1, 101))
    d.run_turn(ProgramMeta("agent"), ctx)
    assert cache.evictable_size() == 0 and cache.protected_size() == 100
    clock.advance(1.0)
    step(cache, clock)
    assert cache.protected_size() == 100
    clock.advance(1.5)
    step(cache, clock)
    assert cache.protected_size() == 0 and cache.evictable_size() == 100
    assert cache.controller.counters.expired == 1
    assert d.fill(256) == 256 and d.cached_len(ctx) == 0


def test_allocation_sheds_pins_instead_of_failing():
    cache, clock = continuum_cache(256, fixed_ttl_s=100.0, pin_budget_fraction=1.0)
    d = TurnDriver(cache)
    d.run_turn(ProgramMeta("early"), list(range(1, 121)))
    d.run_turn(ProgramMeta("late"), list(range(2001, 2121)))
    assert cache.controller.pins.pinned_tokens == 240
    assert d.fill(100) == 100  # only 16 free: must shed, latest program first
    assert "early" in cache.controller.pins and "late" not in cache.controller.pins
    assert cache.controller.counters.shed == 1


def test_budget_bounds_pins():
    cache, clock = continuum_cache(200, fixed_ttl_s=100.0, pin_budget_fraction=0.5)
    d = TurnDriver(cache)
    d.run_turn(ProgramMeta("a"), list(range(1, 61)))
    d.run_turn(ProgramMeta("b"), list(range(1001, 1061)))  # 120 > 100: b (later) is refused
    assert set(p.program_id for p in cache.controller.pins) == {"a"}
    assert cache.protected_size() == 60


def test_every_slot_returns_after_all_programs_end():
    cache, clock = continuum_cache(512, fixed_ttl_s=10.0)
    d = TurnDriver(cache)
    rng = random.Random(0)
    ctx = {p: [] for p in "abcd"}
    for t in range(3):
        for p in ctx:
            ctx[p] = ctx[p] + [rng.randrange(1, 50_000) for _ in range(20)]
            d.run_turn(ProgramMeta(p, is_last_step=(t == 2)), ctx[p])
    assert len(cache.controller.pins) == 0 and cache.protected_size() == 0
    cache.evict(EvictParams(num_tokens=10**6))
    assert d.allocator.available_size() == 512


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("turn"), st.integers(0, 5), st.integers(1, 40), st.booleans()),
            st.tuples(st.just("time"), st.floats(0.0, 3.0)),
            st.tuples(st.just("alloc"), st.integers(1, 300)),
        ),
        max_size=40,
    ),
    budget=st.sampled_from([0.1, 0.5, 1.0]),
)
def test_random_interleavings_keep_invariants(ops, budget):
    size = 400
    cache, clock = continuum_cache(size, fixed_ttl_s=2.0, pin_budget_fraction=budget)
    d = TurnDriver(cache)
    ctx: dict[int, list[int]] = {}
    held = []
    for op in ops:
        if op[0] == "turn":
            _, p, n, last = op
            ctx[p] = ctx.get(p, []) + [(p + 1) * 100_000 + len(ctx.get(p, [])) + i for i in range(n)]
            got = d.run_turn(ProgramMeta(f"p{p}", is_last_step=last), ctx[p])
            if last:
                ctx.pop(p)
            if got is None:
                ctx.pop(p, None)
        elif op[0] == "time":
            clock.advance(op[1])
            step(cache, clock)
        else:
            got = d.alloc(min(op[1], size))
            if got is not None:
                held.append(got)
            # a request that needs memory is always served if nothing else holds it
            if not held:
                assert got is not None
        pins = cache.controller.pins
        cache.check_integrity()
        assert pins.pinned_tokens <= pins.budget_tokens
        for pin in pins:  # a live pin's prefix is resident
            assert d.cached_len(ctx[int(pin.program_id[1:])][: pin.tokens]) == pin.tokens
        for t in held:
            d.allocator.free(t)
        held.clear()
    for p in list(ctx):
        d.run_turn(ProgramMeta(f"p{p}", is_last_step=True), ctx[p])
    assert len(cache.controller.pins) == 0 and cache.protected_size() == 0
    cache.evict(EvictParams(num_tokens=10**6))
    assert d.allocator.available_size() == size


def test_kv_only_pins_hold_is_told_apart_from_kv_requests_hold():
    """The ``kv_*`` series: SGLang counts a pinned prefix as used (it is locked); the part of it no
    live request's lock shares is what shedding pins would give back to waiting turns."""
    from types import SimpleNamespace

    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

    from continuum_lab.harness.cpu_cache import key
    from sglang_continuum.adapter.metrics import kv_occupancy

    cache, clock = continuum_cache(256, fixed_ttl_s=100.0, pin_budget_fraction=1.0)
    d = TurnDriver(cache)
    context = list(range(1, 101))
    d.run_turn(ProgramMeta("agent"), context)  # pinned: 100 tokens locked
    d.fill(50)  # another request's KV, left in the tree unlocked: evictable, not used

    def occupancy(reqs):
        allocator = cache.token_to_kv_pool_allocator
        used = allocator.size - allocator.available_size() - cache.evictable_size()  # as SGLang's token_usage
        return kv_occupancy(SimpleNamespace(full_capacity=allocator.size, full_num_used=used), cache, reqs)

    assert occupancy([]) == {"kv_pool_tokens": 256, "kv_request_tokens": 0, "kv_pinned_reclaimable_tokens": 100}
    match = cache.match_prefix(MatchPrefixParams(key=key(context[:60])))
    running = SimpleNamespace(lock=cache.lock(match.last_device_node))  # a live request on 60 of them
    assert occupancy([running, SimpleNamespace(lock=None)]) == {
        "kv_pool_tokens": 256,
        "kv_request_tokens": 60,
        "kv_pinned_reclaimable_tokens": 40,
    }
    cache.unlock(running.lock)
    assert occupancy([])["kv_pinned_reclaimable_tokens"] == 100
