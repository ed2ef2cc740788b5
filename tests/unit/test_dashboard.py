"""The Grafana dashboard (``configs/grafana/continuum-dashboard.json``): every panel's query names
only series that exist (Continuum's from ``core/series.py``, SGLang's own from its installed
collector) and filters on the dashboard's ``$instance`` and ``$model_name``, as SGLang's own
dashboard does. ``tests/e2e/test_prometheus.py`` runs the same queries against a real server."""

import importlib.util
import json
import re
from pathlib import Path

from sglang_continuum.adapter.metrics import HOLD_LABEL
from sglang_continuum.core.series import BASE_LABELS, CHILD_LABELS, SERIES

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "configs" / "grafana" / "continuum-dashboard.json"
# SGLang 0.5.23's own series the dashboard shows beside Continuum's (checked in its collector below)
SGLANG_SERIES = (
    "sglang:token_usage",
    "sglang:cache_hit_rate",
    "sglang:num_queue_reqs",
    "sglang:num_running_reqs",
    "sglang:time_to_first_token_seconds",
)
SGLANG_HISTOGRAMS = ("sglang:time_to_first_token_seconds",)
# labels a query may group by: the schedulers', the children's, Prometheus's own, a histogram's
GROUP_LABELS = {*BASE_LABELS, *CHILD_LABELS, HOLD_LABEL, "instance", "le"}
SELECTOR = re.compile(r"(sglang:[A-Za-z0-9_:]+)(\{[^}]*\})?")
GROUPING = re.compile(r"\bby \(([^)]*)\)")


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict) -> list[dict]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def queries(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel."""
    return [(p["title"], t["expr"]) for p in panels(dashboard) for t in p["targets"]]


def instantiate(expr: str, *, instance: str, model_name: str, rate_interval: str = "30s") -> str:
    """``expr`` as Grafana sends it for one instance and model: each value regex-escaped, each
    escape doubled inside PromQL's quoted string."""

    def value(text: str) -> str:
        return re.escape(text).replace("\\", "\\\\")

    return (
        expr.replace("$__rate_interval", rate_interval)
        .replace("$instance", value(instance))
        .replace("$model_name", value(model_name))
    )


def _known_names() -> set[str]:
    names = {s.name for s in SERIES} | set(SGLANG_SERIES)
    for name in [s.name for s in SERIES if s.kind == "histogram"] + list(SGLANG_HISTOGRAMS):
        names |= {name + suffix for suffix in ("_bucket", "_sum", "_count")}
    return names


def test_sglangs_series_the_dashboard_shows_exist_in_the_installed_sglang():
    collector = Path(importlib.util.find_spec("sglang").submodule_search_locations[0])
    text = (collector / "srt" / "observability" / "metrics_collector.py").read_text()
    missing = [name for name in SGLANG_SERIES if f'"{name}"' not in text]
    assert not missing, f"not series of this SGLang: {missing}"


def test_the_dashboard_is_templated_on_instance_and_model_name_like_sglangs():
    variables = {v["name"]: v for v in load()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("instance", "model_name"):
        assert variables[name]["type"] == "query" and "label_values(" in variables[name]["definition"], name
        assert variables[name]["definition"].rstrip(")").endswith(name)


def test_every_panel_queries_real_series_filtered_on_the_template_variables():
    dashboard = load()
    assert len(panels(dashboard)) >= 12 and len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    known, problems = _known_names(), []
    for title, expr in queries(dashboard):
        found = SELECTOR.findall(expr)
        if not found:
            problems.append(f"{title}: names no series: {expr}")
        for name, matchers in found:
            if name not in known:
                problems.append(f"{title}: {name} is no series")
            if 'instance=~"$instance"' not in matchers or 'model_name=~"$model_name"' not in matchers:
                problems.append(f"{title}: {name} not filtered on $instance and $model_name")
            if name.startswith("sglang:continuum_") and 'tp_rank="0"' not in matchers:
                problems.append(f"{title}: {name} summed over tensor-parallel ranks (each counts the same)")
        for group in GROUPING.findall(expr):
            unknown = {label.strip() for label in group.split(",")} - GROUP_LABELS
            if unknown:
                problems.append(f"{title}: grouped by labels no series carries: {sorted(unknown)}")
    assert not problems, "\n".join(problems)


def test_the_panels_an_operator_needs_are_there():
    """Held turns and their wait, pins and hits, the cached share of later turns, programs, TTLs,
    the real occupancy beside token_usage, and SGLang's own cache hit rate, queue and TTFT."""
    exprs = "\n".join(expr for _, expr in queries(load()))
    for name in (
        "sglang:continuum_programs_held_back",
        "sglang:continuum_hold_seconds_bucket",
        "sglang:continuum_pin_hits_total",
        "sglang:continuum_pins_created_total",
        "sglang:continuum_return_loss_ratio",
        "sglang:continuum_programs_in_flight",
        "sglang:continuum_programs_paused_total",
        "sglang:continuum_ttl_seconds_bucket",
        "sglang:continuum_kv_request_tokens",
        "sglang:continuum_requests_total",
        *SGLANG_SERIES[:3],
        "sglang:time_to_first_token_seconds_bucket",
    ):
        assert name in exprs, name
    heatmaps = [p for p in panels(load()) if p["type"] == "heatmap"]
    assert any(
        "ttl_seconds_bucket" in t["expr"] and t.get("format") == "heatmap" for p in heatmaps for t in p["targets"]
    )
