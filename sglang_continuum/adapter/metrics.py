"""Prometheus series for Continuum, exported through SGLang's ``/metrics`` (``--enable-metrics``).

Every series is declared once in ``core/series.py``. Created in the scheduler process; SGLang
runs prometheus_client in multiprocess mode, so gauges use ``multiprocess_mode="mostrecent"``
and counters aggregate across processes. Each scheduler writes its own series: labelled with its
tensor-parallel rank and its data-parallel rank (with ``--dp-size N`` every rank's scheduler is
``tp_rank`` 0, and without ``dp_rank`` their gauges would overwrite one another).
"""

from __future__ import annotations

from sglang_continuum.core.controller import ContinuumController
from sglang_continuum.core.series import PREFIX, SERIES

TTL_BUCKETS = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


def _prefill_cost(controller: ContinuumController) -> dict[str, float]:
    c = controller.door.engine.prefill.coefficients()
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
        "decode_share": controller.door.engine.decode_share,
        **_prefill_cost(controller),
        "return_loss_ratio": controller.bounded.return_loss.ratio,
        "release_loss_ratio": controller.door.release_loss(),
        "overtake_budget": controller.bounded.budget(),
        "programs_held_back": held_back,
        "oldest_wait_seconds": oldest_wait_s,
        "host_pinned_programs": len(host),
        "host_pinned_tokens": host.pinned_tokens,
        "host_load_seconds_per_token": controller.door.engine.prefill.load_seconds_per_token() or 0.0,
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
            else:
                metric = Histogram(full, s.doc, tuple(self._labels), buckets=TTL_BUCKETS)
            self._metrics[s.source] = metric.labels(**self._labels)

    def observe_ttl(self, ttl: float) -> None:
        self._metrics["ttl"].observe(ttl)

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
        for source, metric in self._metrics.items():
            group, _, name = source.partition(".")
            if group == "gauge" and self._last.get(source) != gauges[name]:
                metric.set(gauges[name])
                self._last[source] = gauges[name]
