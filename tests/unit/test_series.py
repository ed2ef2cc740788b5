"""One table of series names: the exporter, the benchmark and docs/metrics.md use the same names."""

from pathlib import Path

from sglang_continuum.core.counters import (
    AdmissionCounters,
    HostCounters,
    IdentityCounters,
    PinCounters,
    ProgramCounters,
    ShedCounters,
)
from sglang_continuum.core.series import SERIES, series_name
from tests.support import controller

METRICS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_the_metrics_page_lists_exactly_the_series():
    rows = [line for line in METRICS_PAGE.read_text().splitlines() if line.startswith("| `sglang:continuum_")]
    documented = [row.split("`")[1] for row in rows]
    assert documented == [s.name for s in SERIES], "docs/metrics.md's table is not SERIES (same order)"
    for row, s in zip(rows, SERIES):
        assert s.doc in row, f"{s.name}: the page's text is not the table's"


def test_every_counter_field_is_exported_once():
    sources = [s.source for s in SERIES]
    assert len(sources) == len(set(sources)) and len({s.name for s in SERIES}) == len(SERIES)
    for group, counters in (
        ("counters", PinCounters),
        ("host", HostCounters),
        ("admission", AdmissionCounters),
        ("programs", ProgramCounters),
        ("sheds", ShedCounters),
        ("identity", IdentityCounters),
    ):
        for field in counters.__dataclass_fields__:
            assert f"{group}.{field}" in sources, f"{group}.{field} has no series"


def test_names_follow_prometheus_conventions():
    assert series_name("counters.hits") == "sglang:continuum_pin_hits_total"
    assert all(s.name.startswith("sglang:continuum_") for s in SERIES)
    assert all(s.name.endswith("_total") == (s.kind == "counter") for s in SERIES)


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
    import os
    import subprocess
    import sys

    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    script = (
        "import sys\n"
        "from sglang_continuum.adapter.metrics import ContinuumMetrics\n"
        "from sglang_continuum.core.metadata import ProgramMeta\n"
        "from tests.support import controller\n"
        "rank = int(sys.argv[1])\n"
        "ctl, _ = controller()\n"
        "for i in range(rank + 1):\n"
        "    ctl.turn_arrived(ProgramMeta(f'p{i}'))\n"
        "ContinuumMetrics(tp_rank=0, dp_rank=rank).update(ctl)\n"
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for rank in (0, 1):
        subprocess.run([sys.executable, "-c", script, str(rank)], check=True, env=env, cwd=Path(__file__).parents[2])
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    tracked = {
        (s.labels["tp_rank"], s.labels["dp_rank"]): s.value
        for family in registry.collect()
        for s in family.samples
        if s.name == "sglang:continuum_tracked_programs"
    }
    assert tracked == {("0", "0"): 1.0, ("0", "1"): 2.0}


def test_held_turns_reach_the_hold_histogram_by_kind_and_the_longest_hold_gauge(tmp_path):
    """A first turn held 7 s then admitted lands in ``hold_seconds{turn="first_turn"}``; one still
    held for 3 s is the longest hold; the pause child is exported at 0 before any pause."""
    import os
    import subprocess
    import sys

    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

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
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, cwd=Path(__file__).parents[2])
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    samples = {
        (s.name, s.labels.get("turn"), s.labels.get("le")): s.value for f in registry.collect() for s in f.samples
    }
    assert samples[("sglang:continuum_hold_seconds_count", "first_turn", None)] == 1.0
    assert samples[("sglang:continuum_hold_seconds_sum", "first_turn", None)] == 7.0
    assert samples[("sglang:continuum_hold_seconds_bucket", "first_turn", "5.0")] == 0.0
    assert samples[("sglang:continuum_hold_seconds_bucket", "first_turn", "10.0")] == 1.0
    assert samples[("sglang:continuum_hold_seconds_count", "pause", None)] == 0.0
    assert samples[("sglang:continuum_longest_hold_seconds", None, None)] == 3.0
