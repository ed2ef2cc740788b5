"""The lab's policies: typed, each a real variant of the default, each reaching a server whole."""

import pytest

from continuum_lab.bench import variants
from continuum_lab.bench.policies import POLICIES, Policy, parse_policy
from sglang_continuum.core.metadata import ProgramMeta
from sglang_continuum.core.rules import DEFAULT, Rules, resolve_rules
from sglang_continuum.core.settings import ContinuumSettings
from tests.support import controller

CONTINUUM = [p for p in POLICIES.values() if "continuum" in p.sglang_args]


def test_every_policy_is_a_typed_object():
    assert all(isinstance(p, Policy) for p in POLICIES.values())
    named = [v for v in vars(variants).values() if isinstance(v, Rules)]
    assert {r.name for r in named} >= {"pins-only", "fixed-2s", "reference", "bernstein"}
    for policy in CONTINUUM:
        if policy.rules:
            assert isinstance(getattr(variants, policy.rules), Rules), policy.name


@pytest.mark.parametrize("policy", CONTINUUM, ids=lambda p: p.name)
def test_no_variant_is_the_default_in_disguise(policy):
    settings = ContinuumSettings(**policy.setting_values())
    rules = resolve_rules(settings.rules)
    same = settings == ContinuumSettings() and rules == DEFAULT
    assert same is (policy.name == "continuum"), f"{policy.name} runs exactly the default"


@pytest.mark.parametrize("policy", CONTINUUM, ids=lambda p: p.name)
def test_a_spawned_server_reads_the_same_settings(policy):
    _, env = parse_policy(policy.name)
    assert ContinuumSettings.load(environ=env) == ContinuumSettings(**policy.setting_values())


def test_a_misspelt_setting_fails_where_the_variant_is_defined():
    with pytest.raises(ValueError, match="pin_budget_fractoin"):
        Policy("continuum-typo", ("--schedule-policy", "continuum"), {"pin_budget_fractoin": 0.0})
    with pytest.raises(ValueError, match="does not resolve"):
        Policy("continuum-typo", ("--schedule-policy", "continuum"), rules="PINS_ONLYY")


def test_parameterised_variants_resolve_with_their_arguments():
    rules = resolve_rules("continuum_lab.bench.variants:fixed_ttl(seconds=5, program_idle_timeout_s=20)")
    assert rules.name == "fixed-5s" and rules.timings.program_idle_timeout_s == 20
    with pytest.raises(ValueError, match="key=value"):
        resolve_rules("continuum_lab.bench.variants:fixed_ttl(5)")
    with pytest.raises(ValueError, match="does not resolve"):
        resolve_rules("continuum_lab.bench.variants:fixed_ttl(seconds=__import__('os'))")


def test_with_pause_binding_a_held_pause_binds_the_door_while_no_first_turn_was_held_lately():
    """Just past the fit no first turn waits and the door never binds, yet returns find their
    contexts gone and pause. Under ``continuum-pause-binds`` a paused return held binds the door,
    and a program finishing its turn stays resident (pinned for its tool's p90: 9 s, a's return
    after 0 s among the samples). Where a first turn was held lately (30 s ago, its own binding
    long over), the held pause does not bind; nor does it under the product's rule."""
    cases = ((variants.DoorWithPauseBinding, None, True), (variants.DoorWithPauseBinding, 30.0, False))
    cases += ((None, None, False),)  # the product's door
    for door, first_held_ago, resident in cases:
        c, clock = controller(fixed_ttl_s=0.0, rebuild_s=12.0, max_overtakes=0, door=door)
        for seconds in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0):
            c.stats.record("bash", seconds)
        meta = {pid: ProgramMeta(pid, tool_name="bash") for pid in ("a", "b", "new")}
        a = c.turn_arrived(meta["a"])
        c.turn_admitted(a, 500)
        c.turn_finished(meta["a"], context_tokens=500, handle=object(), tag=a)  # no pin: a leaves
        b = c.turn_arrived(meta["b"])
        c.turn_admitted(b, 600)
        if first_held_ago is not None:
            assert c.holds_back(c.turn_arrived(meta["new"]), 500, 1000)  # a first turn held
            clock.advance(first_held_ago)
        assert not c.residency.binding(clock())
        back = c.turn_arrived(meta["a"], prompt_tokens=700, cached_tokens=lambda: 0)
        assert back.context_gone and c.holds_back(back, 700, 1000)  # paused
        assert c.residency.binding(clock()) is resident
        out = c.turn_finished(meta["b"], context_tokens=600, handle=object(), tag=b)
        assert (out.pin is not None and out.ttl == 9.0) is resident, (door, first_held_ago)
        assert ("b" in c.door.working_set) is resident
        c.check_integrity()
