"""Prometheus series for Continuum, exported through SGLang's ``/metrics`` (``--enable-metrics``).

Created in the scheduler process; SGLang runs prometheus_client in multiprocess mode, so gauges
use ``multiprocess_mode="mostrecent"`` and counters aggregate across processes.
"""

from __future__ import annotations

from sglang_continuum.core.controller import ContinuumController, HostCounters, PinCounters

TTL_BUCKETS = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


class ContinuumMetrics:
    def __init__(self, tp_rank: int = 0) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        labels = ("tp_rank",)
        self._labels = {"tp_rank": str(tp_rank)}

        def gauge(name: str, doc: str):
            return Gauge(f"sglang:continuum_{name}", doc, labels, multiprocess_mode="mostrecent").labels(
                **self._labels
            )

        def counter(name: str, doc: str):
            return Counter(f"sglang:continuum_{name}", doc, labels).labels(**self._labels)

        self._gauge, self._counter = gauge, counter
        self._host: dict = {}
        self._last_host = HostCounters()
        self.pinned_programs = gauge("pinned_programs", "Programs whose prefix is TTL-pinned.")
        self.pinned_tokens = gauge("pinned_tokens", "Tokens held by TTL pins (path lengths).")
        self.pin_budget_tokens = gauge("pin_budget_tokens", "Most tokens pins may hold.")
        self.tracked_programs = gauge("tracked_programs", "Programs the registry remembers.")
        self._counters = {
            "created": counter("pins_created", "Pins created after a non-final turn."),
            "hits": counter("pin_hits", "Next turns admitted while their pin held the prefix."),
            "expired": counter("pin_expiries", "Pins released at their deadline."),
            "shed": counter("pin_sheds", "Pins released early under memory or budget pressure."),
            "refused": counter("pins_refused", "Pins not created: budget full of earlier programs."),
            "released": counter("pin_releases", "Pins released by last step, abort or retraction."),
        }
        self.ttl_seconds = Histogram(
            "sglang:continuum_ttl_seconds", "TTL chosen per pin decision.", labels, buckets=TTL_BUCKETS
        ).labels(**self._labels)
        self._last = PinCounters()

    def add_host_series(self) -> None:
        """HiCache is on: series for offloads, host hits and predictive reloads."""
        if self._host:
            return
        counter = self._counter
        self.host_pinned_programs = self._gauge("host_pinned_programs", "Programs whose host copy is protected.")
        self.host_pinned_tokens = self._gauge("host_pinned_tokens", "Host tokens protected by host pins.")
        self._host = {
            "offloaded": counter("offloads", "Expired or shed pins whose prefix went to a protected host copy."),
            "offload_failed": counter("offload_failures", "Offloads that found no host room."),
            "host_hits": counter("host_hits", "Returning turns that loaded their prefix back from host."),
            "host_hit_tokens": counter("host_hit_tokens", "Tokens loaded back from host instead of recomputed."),
            "host_expired": counter("host_pin_expiries", "Host pins released at their host TTL."),
            "host_released": counter("host_pin_releases", "Host pins released by return, last step, abort, budget."),
            "reloads_started": counter("predictive_reloads_started", "Predictive reloads started."),
            "reloads_used": counter("predictive_reloads_used", "Predictive reloads the returning turn found on device."),
            "reloads_wasted": counter("predictive_reloads_wasted", "Predictive reloads evicted or never used."),
        }

    def observe_ttl(self, ttl: float) -> None:
        self.ttl_seconds.observe(ttl)

    def update(self, controller: ContinuumController) -> None:
        pins = controller.pins
        self.pinned_programs.set(len(pins))
        self.pinned_tokens.set(pins.pinned_tokens)
        self.pin_budget_tokens.set(pins.budget_tokens)
        self.tracked_programs.set(len(controller.programs))
        self._last = _advance(self._counters, controller.counters, self._last)
        if self._host:
            self.host_pinned_programs.set(len(controller.host_pins))
            self.host_pinned_tokens.set(controller.host_pins.pinned_tokens)
            self._last_host = _advance(self._host, controller.host_counters, self._last_host)


def _advance(series: dict, now, last):
    """Add to each Prometheus counter what the controller's counter gained since ``last``; return
    a copy of ``now`` for next time (Prometheus counters only go up)."""
    for field, metric in series.items():
        delta = getattr(now, field) - getattr(last, field)
        if delta > 0:
            metric.inc(delta)
    return type(now)(**{f: getattr(now, f) for f in type(now).__slots__})
