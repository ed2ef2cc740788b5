"""Prometheus series for Continuum, exported through SGLang's ``/metrics`` (``--enable-metrics``).

Every series is declared once in ``core/series.py``. Created in the scheduler process; SGLang
runs prometheus_client in multiprocess mode, so gauges use ``multiprocess_mode="mostrecent"``
and counters aggregate across processes. Each scheduler writes its own series: labelled with its
tensor-parallel rank and its data-parallel rank (with ``--dp-size N`` every rank's scheduler is
``tp_rank`` 0, and without ``dp_rank`` their gauges would overwrite one another).
"""

from __future__ import annotations

from sglang_continuum.core.controller import ContinuumController
from sglang_continuum.core.residency import FIRST_TURN, PAUSE
from sglang_continuum.core.series import PREFIX, SERIES

TTL_BUCKETS = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
# a held turn's wait: seconds to the OpenAI SDK's 600 s timeout and past it
HOLD_BUCKETS = (1.0, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 300.0, 600.0, 1200.0)
HOLD_LABEL = "turn"  # the hold's kind: first_turn or pause


def _prefill_cost(controller: ContinuumController) -> dict[str, float]:
    c = controller.residency.engine.prefill.coefficients()
    c0, c1, c2 = (0.0, 0.0, 0.0) if c is None else map(float, c)
    return {"prefill_step_seconds": c0, "prefill_seconds_per_token": c1, "prefill_seconds_per_pair": c2}


def gauge_values(
    controller: ContinuumController, *, held_back: int = 0, oldest_wait_s: float = 0.0, stats_peers: int = 0
) -> dict[str, float]:
    pins, host, working = controller.pins, controller.host.pins, controller.door.working_set
    return {
        "pinned_programs": len(pins),
        "pinned_tokens": pins.pinned_tokens,
        "pin_budget_tokens": pins.budget_tokens,
        "tracked_programs": len(controller.programs),
        "programs_in_flight": len(working),
        "working_set_tokens": working.tokens,
        "working_set_reserved_tokens": working.reserved_tokens(),
        "expected_final_context_tokens": working.expected_final_context,
        "growth_reserved": int(working.reserve_growth),
        "decode_share": controller.residency.engine.decode_share,
        **_prefill_cost(controller),
        "return_loss_ratio": controller.bounded.return_loss.ratio,
        "release_loss_ratio": controller.residency.release_loss(),
        "overtake_budget": controller.bounded.budget(),
        "programs_held_back": held_back,
        "oldest_wait_seconds": oldest_wait_s,
        "longest_hold_seconds": controller.residency.holds.longest(controller.clock()),
        "host_pinned_programs": len(host),
        "host_pinned_tokens": host.pinned_tokens,
        "host_load_seconds_per_token": controller.residency.engine.prefill.load_seconds_per_token() or 0.0,
        "stats_peers": stats_peers,
    }


class ContinuumMetrics:
    def __init__(self, tp_rank: int = 0, dp_rank: int = 0) -> None:
        self._labels = {"tp_rank": str(tp_rank), "dp_rank": str(dp_rank)}
        self._metrics: dict[str, object] = {}
        self._last: dict[str, float] = {}  # values at the last update (only changes are written)
        self._add(s for s in SERIES if not s.host_only)

    def add_host_series(self) -> None:
        """HiCache is on: series for offloads and host hits."""
        self._add(s for s in SERIES if s.host_only and s.source not in self._metrics)

    def _add(self, series) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        for s in series:
            full = PREFIX + s.short
            if s.kind == "gauge":
                metric = Gauge(full, s.doc, tuple(self._labels), multiprocess_mode="mostrecent")
            elif s.kind == "counter":
                metric = Counter(full, s.doc, tuple(self._labels))
            elif s.source == "holds":  # one child per kind of hold, each exported from the start
                self._holds = Histogram(full, s.doc, (*self._labels, HOLD_LABEL), buckets=HOLD_BUCKETS)
                for kind in (FIRST_TURN, PAUSE):
                    self._holds.labels(**self._labels, **{HOLD_LABEL: kind})
                continue
            else:
                metric = Histogram(full, s.doc, tuple(self._labels), buckets=TTL_BUCKETS)
            self._metrics[s.source] = metric.labels(**self._labels)

    def observe_ttl(self, ttl: float) -> None:
        self._metrics["ttl"].observe(ttl)

    def _observe_holds(self, controller: ContinuumController) -> None:
        """The holds that ended since the last update (each admitted turn the door held)."""
        ended = controller.residency.holds.ended
        while ended:
            kind, seconds = ended.popleft()
            self._holds.labels(**self._labels, **{HOLD_LABEL: kind}).observe(seconds)

    def update(
        self,
        controller: ContinuumController,
        saver=None,
        exchange=None,
        *,
        held_back: int = 0,
        oldest_wait_s: float = 0.0,
    ) -> None:
        groups = {
            "counters": controller.counters,
            "host": controller.host.counters,
            "admission": controller.admission,
            "sheds": controller.sheds,
            "programs": controller.program_counters,
            "identity": controller.identity,
            "holds": controller.residency.holds,
            "saver": saver,
            "exchange": exchange.counters if exchange is not None else None,
        }
        peers = exchange.peers_alive(controller.clock()) if exchange is not None else 0
        gauges = gauge_values(controller, held_back=held_back, oldest_wait_s=oldest_wait_s, stats_peers=peers)
        # counters before gauges: a scrape that sees a gauge's new value (a pin released) also
        # sees the counts of the same step (the hit that released it); no scrape is atomic
        for source, metric in self._metrics.items():
            group, _, name = source.partition(".")
            if group in groups:
                value = getattr(groups[group], name, 0) if groups[group] is not None else 0
                delta = value - self._last.get(source, 0)
                if delta > 0:
                    metric.inc(delta)
                self._last[source] = value
        self._observe_holds(controller)
        for source, metric in self._metrics.items():
            group, _, name = source.partition(".")
            if group == "gauge" and self._last.get(source) != gauges[name]:
                metric.set(gauges[name])
                self._last[source] = gauges[name]
