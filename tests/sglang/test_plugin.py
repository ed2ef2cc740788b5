"""Tier 2: the entry-point plugin against SGLang's real argument and hook machinery."""

import argparse
import json

import pytest

from sglang_continuum.adapter import plugin

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module", autouse=True)
def loaded():
    from sglang.srt.plugins import load_plugins

    load_plugins()


def test_entry_point_is_installed():
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert eps["continuum"] == "sglang_continuum.adapter.plugin:register"


def test_continuum_is_a_cli_choice():
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model-path", "x", "--schedule-policy", "continuum"])
    assert ns.schedule_policy == "continuum"
    with pytest.raises(SystemExit):
        parser.parse_args(["--model-path", "x", "--schedule-policy", "nonsense"])


def test_hooks_are_applied_in_this_process():
    plugin.check_active()  # raises if any hook is missing
    from sglang.srt.managers.scheduler import Scheduler

    assert Scheduler.init_schedule_policy.__wrapped__ is plugin._originals[plugin.INIT_POLICY]


def test_refuses_to_start_when_hooks_are_missing(monkeypatch):
    monkeypatch.setattr(plugin, "_originals", {"json.dumps": json.dumps})
    with pytest.raises(plugin.ContinuumPluginError, match="not active"):
        plugin.check_active()
    monkeypatch.setattr(plugin, "_originals", {})
    with pytest.raises(plugin.ContinuumPluginError, match="plugin not registered"):
        plugin.check_active()


def test_refuses_to_start_on_another_sglang_version(monkeypatch):
    monkeypatch.setattr(plugin, "installed_sglang_version", lambda: "0.5.24")
    with pytest.raises(plugin.ContinuumPluginError, match=r"needs sglang==0\.5\.23; sglang 0\.5\.24 is installed"):
        plugin.check_active()


def test_bad_settings_fail_at_startup(monkeypatch):
    monkeypatch.setenv("SGLANG_CONTINUUM_RULES", "continuum_lab.bench.variants:TELEPATHY")
    with pytest.raises(ValueError, match="invalid sglang-continuum settings"):
        plugin.check_active()
    monkeypatch.delenv("SGLANG_CONTINUUM_RULES")
    monkeypatch.setenv("SGLANG_CONTINUUM_TTL_MODEL", "cost")  # a setting that no longer exists
    with pytest.raises(ValueError, match="SGLANG_CONTINUUM_TTL_MODEL"):
        plugin.check_active()


def test_cache_hook_only_swaps_the_class_for_continuum():
    from types import SimpleNamespace

    from sglang.srt.managers.schedule_policy import SchedulePolicy

    from sglang_continuum.adapter.radix_cache import ContinuumRadixCache

    def chosen(policy, cache_class=None):
        ctx = SimpleNamespace(server_args=SimpleNamespace(schedule_policy=policy))
        return plugin._around_create_cache(lambda c, cache_class=None: cache_class, ctx, cache_class=cache_class)

    assert chosen("fcfs") is None and chosen("lpm") is None  # SGLang picks its default
    assert chosen("continuum") is ContinuumRadixCache
    sentinel = object()
    assert chosen("continuum", cache_class=sentinel) is sentinel  # an explicit class wins
    assert SchedulePolicy.calc_priority.__module__ == "sglang.srt.managers.schedule_policy"


def test_server_tool_call_parser_names_tools_without_the_request_tool_list():
    from sglang_continuum.adapter.tool_identifier import sglang_detector

    parse = sglang_detector("qwen25")
    assert parse('<tool_call>\n{"name": "fetch_url", "arguments": {"url": "x"}}\n</tool_call>') == "fetch_url"
    assert parse("no call here") is None
    assert sglang_detector("no-such-parser") is None


@pytest.mark.parametrize(
    "field, value, flag",
    [
        ("attn_dp_size", 2, "--attn-dp-size"),
        ("enable_prefill_delayer", True, "--enable-prefill-delayer"),
        ("disaggregation_mode", "prefill", "--disaggregation-mode"),
        ("enable_priority_scheduling", True, "--enable-priority-scheduling"),
        ("pp_size", 2, "--pp-size"),
    ],
)
def test_modes_the_binding_cannot_serve_stop_start_up_naming_the_flag(tiny_model, field, value, flag):
    from sglang.srt.server_args import ServerArgs

    from sglang_continuum.adapter.modes import check_supported

    args = ServerArgs(model_path=tiny_model, schedule_policy="continuum", **{field: value})
    with pytest.raises(RuntimeError, match=flag):
        plugin._after_resolve(None, args)  # in the launcher, before a scheduler starts
    with pytest.raises(RuntimeError, match=flag):
        check_supported(args)  # and in the scheduler (the in-process harness skips the launcher)
    check_supported(ServerArgs(model_path=tiny_model, schedule_policy="continuum"))  # the defaults are served
    with pytest.raises(RuntimeError, match="hybrid Mamba/SSM"):
        check_supported(ServerArgs(model_path=tiny_model), hybrid_ssm=True)


def test_a_turn_committed_on_an_exact_fit_is_not_recorded_as_blocked():
    """SGLang's ``add_one_req`` answers, after committing a request, for the next candidate: on an
    exact fit that is NO_TOKEN. The request it just took must not be the selection's blocked turn
    (pins ranked after it would be shed for a turn that is already in)."""
    from types import SimpleNamespace

    from sglang.srt.managers.schedule_policy import AddReqResult

    from sglang_continuum.adapter.binding import Admission

    class ExactFit:  # the adder after an exact fit: the request is taken, the budget is spent
        def __init__(self, commit: bool) -> None:
            self.can_run_list, self.commit = [], commit
            self.running_batch = SimpleNamespace(is_empty=lambda: False)

        def add_one_req(self, req, has_chunked_req, truncation_align_size):
            if self.commit:
                self.can_run_list.append(req)
            return AddReqResult.NO_TOKEN

    admission = Admission(SimpleNamespace(chunked_req=None), SimpleNamespace(), policy=None)
    taken = SimpleNamespace(rid="taken")
    adder = admission.adder_class(ExactFit)(commit=True)
    assert adder.add_one_req(taken, False, 0) is AddReqResult.NO_TOKEN
    assert admission.blocked is None and adder.can_run_list == [taken]
    refused = SimpleNamespace(
        rid="refused", full_untruncated_fill_ids=[0] * 100, prefix_len=0, output_ids=[],
        sampling_params=SimpleNamespace(max_new_tokens=4),
    )  # fmt: skip
    adder = admission.adder_class(ExactFit)(commit=False)
    adder.per_req_token_overhead, adder.memory_budget = 0, SimpleNamespace(remaining_total=50)
    assert adder.add_one_req(refused, False, 0) is AddReqResult.NO_TOKEN
    assert admission.blocked is refused and admission.shortfall == 54
