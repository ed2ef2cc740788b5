"""One table of series names: the exporter, the benchmark and docs/metrics.md use the same names.

``python -m tests.unit.test_series`` writes the page's table from ``core/series.py``."""

import os
import subprocess
import sys
from pathlib import Path

from sglang_continuum.core.counters import (
    AdmissionCounters,
    HostCounters,
    IdentityCounters,
    PinCounters,
    ProgramCounters,
    ShedCounters,
)
from sglang_continuum.core.series import FAMILIES, FAMILY_HELP, NOT_EXPORTED, SERIES, help_text, series_key, series_name
from tests.support import controller

ROOT = Path(__file__).resolve().parents[2]
METRICS_PAGE = ROOT / "docs" / "metrics.md"
TABLE_START = "<!-- generated from sglang_continuum/core/series.py: python -m tests.unit.test_series -->"
TABLE_END = "<!-- end of the generated table -->"


def _extra_labels(short: str) -> list[str]:
    """The labels a family carries beside model_name, tp_rank and dp_rank."""
    from sglang_continuum.adapter.metrics import HOLD_LABEL, info_labels

    first = FAMILIES[short][0]
    if first.source == "info":
        return list(info_labels(controller()[0]))
    if first.source == "holds":
        return [HOLD_LABEL]
    return [first.label_name] if first.label else []


def metrics_table() -> str:
    """The page's table of every series: one row per family, a row per child of a labelled one."""
    lines = ["| series | kind | labels | meaning |", "|---|---|---|---|"]
    for short, rows in FAMILIES.items():
        first = rows[0]
        kind = first.kind + (", HiCache only" if first.host_only else "")
        labels = ", ".join(f"`{name}`" for name in _extra_labels(short))
        lines.append(f"| `{first.name}` | {kind} | {labels} | {help_text(short)} |")
        if first.label:
            lines += [f'| ↳ `{s.label_name}="{s.label_value}"` | | | {s.doc} |' for s in rows]
    return "\n".join(lines)


def _page_table(text: str) -> str:
    return text.split(TABLE_START, 1)[1].split(TABLE_END, 1)[0].strip()


def test_the_metrics_pages_table_is_the_series_table():
    assert _page_table(METRICS_PAGE.read_text()) == metrics_table(), (
        "docs/metrics.md's table is not core/series.py's: python -m tests.unit.test_series rewrites it"
    )


def test_a_family_is_one_fact_told_apart_by_one_label():
    """Rows sharing a name are adjacent, of one kind, each a child under one label with a value of
    its own, and the family has help text of its own; a name with one row has no label."""
    shorts = [s.short for s in SERIES]
    assert [short for i, short in enumerate(shorts) if i == 0 or short != shorts[i - 1]] == list(FAMILIES)
    for short, rows in FAMILIES.items():
        if len(rows) == 1:
            assert not rows[0].label and short not in FAMILY_HELP, short
            continue
        assert len({(s.kind, s.label_name, s.host_only) for s in rows}) == 1 and rows[0].label, short
        assert len({s.label_value for s in rows}) == len(rows) and short in FAMILY_HELP, short
    assert set(FAMILY_HELP) <= set(FAMILIES)


def test_every_counter_field_is_exported_once():
    sources = [s.source for s in SERIES]
    assert len(sources) == len(set(sources)) and len({s.key for s in SERIES}) == len(SERIES)
    assert not set(NOT_EXPORTED) & set(sources)
    for group, counters in (
        ("counters", PinCounters),
        ("host", HostCounters),
        ("admission", AdmissionCounters),
        ("programs", ProgramCounters),
        ("sheds", ShedCounters),
        ("identity", IdentityCounters),
    ):
        for field in counters.__dataclass_fields__:
            source = f"{group}.{field}"
            assert source in sources or source in NOT_EXPORTED, f"{source} has no series"


def test_names_follow_prometheus_conventions():
    assert series_name("counters.hits") == "sglang:continuum_pin_hits_total"
    assert series_key("sheds.alloc") == 'sglang:continuum_pin_sheds_total{reason="alloc"}'
    assert all(s.name.startswith("sglang:continuum_") for s in SERIES)
    assert all(s.name.endswith("_total") == (s.kind == "counter") for s in SERIES)
    shares = [s.short for s in SERIES if s.kind == "gauge" and s.doc.startswith("Share of")]
    assert shares and all(short.endswith("_ratio") for short in shares), shares


def _collect(tmp_path: Path, script: str, *args: str) -> list:
    """Run ``script`` in a process of its own writing to a multiprocess directory, as a scheduler
    does under SGLang, and collect what a scrape of that directory shows."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", script, *args], check=True, env=env, cwd=ROOT)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    return [sample for family in registry.collect() for sample in family.samples]


def test_every_child_is_exported_from_the_start_with_the_schedulers_labels(tmp_path):
    """One pin shed for an allocation: its child reads 1 and every other reason 0 (a rate over
    them is 0, not absent), as does every id source; every series carries the served model's
    name; the info series reads 1 with the version and settings."""
    script = (
        "from sglang_continuum.adapter.metrics import ContinuumMetrics, info_labels\n"
        "from tests.support import controller\n"
        "ctl, _ = controller(max_hold_s=120)\n"
        "ctl.sheds.alloc += 1\n"
        "ContinuumMetrics(model_name='tiny', dp_rank=1, info=info_labels(ctl)).update(ctl)\n"
    )
    samples = _collect(tmp_path, script)
    assert {(s.labels.get("model_name"), s.labels.get("dp_rank")) for s in samples} == {("tiny", "1")}
    sheds = {s.labels["reason"]: s.value for s in samples if s.name == "sglang:continuum_pin_sheds_total"}
    assert sheds == {"admission": 0, "idle": 0, "hold_bound": 0, "alloc": 1, "budget": 0, "stale": 0, "gap": 0}
    sources = {s.labels["id_source"] for s in samples if s.name == "sglang:continuum_requests_total"}
    assert sources == {"program_id", "session_id", "routing_key", "inferred", "first_turn", "none"}
    keys = {
        s.name + "".join(f'{{{k}="{s.labels[k]}"}}' for k in ("reason", "id_source") if k in s.labels) for s in samples
    }
    missing = [s.key for s in SERIES if not s.host_only and s.kind != "histogram" and s.key not in keys]
    assert not missing, missing
    (info,) = [s for s in samples if s.name == "sglang:continuum_info"]
    assert info.value == 1 and info.labels["max_hold_s"] == "120" and info.labels["version"]


def test_a_scrape_that_sees_a_gauge_change_sees_the_counts_behind_it():
    """Scrapes are not atomic: counters are written before gauges, so a client that waits for
    a gauge (a host pin released) and then reads a counter (the host hit that released it)
    never reads the counter stale. The recorders stand in for prometheus_client's children."""
    from sglang_continuum.adapter.metrics import ContinuumMetrics

    ctl, _ = controller()
    writes: list[str] = []

    class Recorder:
        def __init__(self, source: str) -> None:
            self.source = source

        def inc(self, _delta: float) -> None:
            writes.append(self.source)

        def set(self, _value: float) -> None:
            writes.append(self.source)

    metrics = ContinuumMetrics.__new__(ContinuumMetrics)
    metrics._last = {"gauge.host_pinned_programs": 1.0}
    metrics._metrics = {s.source: Recorder(s.source) for s in SERIES if s.kind != "histogram"}
    ctl.host.counters.host_hits += 1
    metrics.update(ctl)
    assert "host.host_hits" in writes and "gauge.host_pinned_programs" in writes
    first_gauge = min(i for i, source in enumerate(writes) if source.startswith("gauge."))
    assert all(not source.startswith("gauge.") for source in writes[:first_gauge])
    assert all(source.startswith("gauge.") for source in writes[first_gauge:]), writes


def test_each_data_parallel_rank_keeps_its_own_gauges(tmp_path):
    """Under ``--dp-size N`` every rank's scheduler is tp_rank 0, each in a process of its own
    writing to SGLang's multiprocess directory: a ``mostrecent`` gauge must not let the last
    rank to write hide the others."""
    script = (
        "import sys\n"
        "from sglang_continuum.adapter.metrics import ContinuumMetrics\n"
        "from sglang_continuum.core.metadata import ProgramMeta\n"
        "from tests.support import controller\n"
        "rank = int(sys.argv[1])\n"
        "ctl, _ = controller()\n"
        "for i in range(rank + 1):\n"
        "    ctl.turn_arrived(ProgramMeta(f'p{i}'))\n"
        "ContinuumMetrics(model_name='tiny', tp_rank=0, dp_rank=rank).update(ctl)\n"
    )
    _collect(tmp_path, script, "0")
    tracked = {
        (s.labels["model_name"], s.labels["tp_rank"], s.labels["dp_rank"]): s.value
        for s in _collect(tmp_path, script, "1")
        if s.name == "sglang:continuum_tracked_programs"
    }
    assert tracked == {("tiny", "0", "0"): 1.0, ("tiny", "0", "1"): 2.0}


def test_held_turns_reach_the_hold_histogram_by_kind_and_the_longest_hold_gauge(tmp_path):
    """A first turn held 7 s then admitted lands in ``hold_seconds{turn="first_turn"}``; one still
    held for 3 s is the longest hold; the pause child is exported at 0 before any pause."""
    script = (
        "from sglang_continuum.adapter.metrics import ContinuumMetrics\n"
        "from sglang_continuum.core.metadata import ProgramMeta\n"
        "from tests.support import controller\n"
        "ctl, clock = controller(max_overtakes=0)\n"
        "ctl.turn_admitted(ctl.turn_arrived(ProgramMeta('a')), 800)\n"
        "held = ctl.turn_arrived(ProgramMeta('held'))\n"
        "assert ctl.holds_back(held, 300, 1000)\n"
        "clock.advance(4.0)\n"
        "later = ctl.turn_arrived(ProgramMeta('later'))\n"
        "assert ctl.holds_back(later, 300, 1000)\n"
        "clock.advance(3.0)\n"
        "ctl.turn_admitted(held, 300)\n"
        "ContinuumMetrics().update(ctl)\n"
    )
    samples = {(s.name, s.labels.get("turn"), s.labels.get("le")): s.value for s in _collect(tmp_path, script)}
    assert samples[("sglang:continuum_hold_seconds_count", "first_turn", None)] == 1.0
    assert samples[("sglang:continuum_hold_seconds_sum", "first_turn", None)] == 7.0
    assert samples[("sglang:continuum_hold_seconds_bucket", "first_turn", "5.0")] == 0.0
    assert samples[("sglang:continuum_hold_seconds_bucket", "first_turn", "10.0")] == 1.0
    assert samples[("sglang:continuum_hold_seconds_count", "pause", None)] == 0.0
    assert samples[("sglang:continuum_longest_hold_seconds", None, None)] == 3.0


if __name__ == "__main__":  # rewrite the page's table from core/series.py
    head, rest = METRICS_PAGE.read_text().split(TABLE_START, 1)
    METRICS_PAGE.write_text(f"{head}{TABLE_START}\n{metrics_table()}\n{TABLE_END}{rest.split(TABLE_END, 1)[1]}")
