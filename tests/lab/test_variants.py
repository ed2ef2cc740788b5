"""The lab's policies: typed, each a real variant of the default, each reaching a server whole."""

import pytest

from continuum_lab.bench import variants
from continuum_lab.bench.policies import POLICIES, Policy, parse_policy
from sglang_continuum.core.rules import DEFAULT, Rules, resolve_rules
from sglang_continuum.core.settings import ContinuumSettings

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
