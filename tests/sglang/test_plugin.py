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
