"""Prometheus series for Continuum, exported through SGLang's ``/metrics`` (``--enable-metrics``).

Every series is declared once in ``core/series.py``. Created in the scheduler process; SGLang
runs prometheus_client in multiprocess mode, so gauges use ``multiprocess_mode="mostrecent"``
and counters aggregate across processes. Each scheduler writes its own series, labelled as
SGLang's scheduler labels its own: the served model's name, the tensor-parallel rank and the
data-parallel rank (with ``--dp-size N`` every rank's scheduler is ``tp_rank`` 0, and without
``dp_rank`` their gauges would overwrite one another). A family's children (``reason``,
``id_source``) are all made at start, so a rate over one that never moved reads 0, not nothing.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Optional

from sglang_continuum import __version__
from sglang_continuum.core.controller import ContinuumController
from sglang_continuum.core.residency import FIRST_TURN, PAUSE
from sglang_continuum.core.series import BASE_LABELS, PREFIX, SERIES, Series, help_text

TTL_BUCKETS = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
# a held turn's wait: seconds to the OpenAI SDK's 600 s timeout and past it
HOLD_BUCKETS = (1.0, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 300.0, 600.0, 1200.0)
HOLD_LABEL = "turn"  # the hold's kind: first_turn or pause
KV_GAUGES = ("kv_pool_tokens", "kv_request_tokens", "kv_pinned_reclaimable_tokens")


def _prefill_cost(controller: ContinuumController) -> dict[str, float]:
    c = controller.residency.engine.prefill.coefficients()
    c0, c1, c2 = (0.0, 0.0, 0.0) if c is None else map(float, c)
    return {"prefill_step_seconds": c0, "prefill_seconds_per_token": c1, "prefill_seconds_per_pair": c2}


def info_labels(controller: ContinuumController) -> dict[str, str]:
    """What ``sglang:continuum_info`` says: the version and a few settings, each one value per
    server (a label's values stay few)."""
    s = controller.settings
    return {
        "version": __version__,
        "rules": controller.rules.name,
        "ttl_model": controller.ttl_model.name,
        "admission_control": "on" if s.admission_control else "off",
        "max_hold_s": f"{s.max_hold_s:g}",
        "max_ttl_s": f"{s.max_ttl_s:g}",
        "pin_budget_fraction": f"{s.pin_budget_fraction:g}",
    }


def kv_occupancy(pool_stats, cache, reqs: Iterable) -> dict[str, int]:
    """The device KV pool as SGLang's ``token_usage`` counts it (``pool_stats``: its
    ``PoolStats``), with the KV only pins hold set apart: the tree nodes on a pin's path that no
    live request (``reqs``) holds a lock on. Pinned nodes are locked, so SGLang counts them used."""
    tree = cache.tree_core
    held: set = set()
    for lock in (getattr(req, "lock", None) for req in reqs):
        if lock is not None:
            held.update(node.node_id for node in _path(tree, lock.node))
    pinned = {
        node.node_id: node.full_value_len or 0  # None: not on the device
        for pin in cache.controller.pins
        if pin.handle is not None
        for node in _path(tree, pin.handle.node)
    }
    reclaimable = sum(tokens for node_id, tokens in pinned.items() if node_id not in held)
    return {
        "kv_pool_tokens": int(pool_stats.full_capacity),
        "kv_request_tokens": max(0, int(pool_stats.full_num_used) - reclaimable),
        "kv_pinned_reclaimable_tokens": reclaimable,
    }


def _path(tree, node_id) -> tuple:
    """The root-to-node path of ``node_id`` (nothing for a node no longer in the tree)."""
    try:
        return tree.collect_path_info([node_id])[0]
    except KeyError:
        return ()


def gauge_values(
    controller: ContinuumController,
    *,
    held_back: int = 0,
    oldest_wait_s: float = 0.0,
    stats_peers: int = 0,
    occupancy: Optional[Mapping[str, int]] = None,
) -> dict[str, float]:
    pins, host, working = controller.pins, controller.host.pins, controller.door.working_set
    occupancy = occupancy or {}
    return {
        "pinned_programs": len(pins),
        "pinned_tokens": pins.pinned_tokens,
        "pin_budget_tokens": pins.budget_tokens,
        **{name: occupancy.get(name, 0) for name in KV_GAUGES},
        "tracked_programs": len(controller.programs),
        "programs_in_flight": len(working),
        "working_set_tokens": working.tokens,
        "working_set_reserved_tokens": working.reserved_tokens(),
        "expected_final_context_tokens": working.expected_final_context,
        "growth_reserved": int(working.reserve_growth),
        "decode_share_ratio": controller.residency.engine.decode_share,
        **_prefill_cost(controller),
        "return_loss_ratio": controller.bounded.return_loss.ratio,
        "release_loss_ratio": controller.residency.release_loss(),
        "overtake_budget": controller.bounded.budget(),
        "programs_held_back": held_back,
        "oldest_wait_seconds": oldest_wait_s,
        "longest_hold_seconds": controller.residency.holds.longest(controller.clock()),
        "critical_programs": len(controller.critical),
        "critical_reserve_tokens": controller.critical.reserve_tokens,
        "host_pinned_programs": len(host),
        "host_pinned_tokens": host.pinned_tokens,
        "host_load_seconds_per_token": controller.residency.engine.prefill.load_seconds_per_token() or 0.0,
        "stats_peers": stats_peers,
    }


class ContinuumMetrics:
    def __init__(
        self, model_name: str = "", tp_rank: int = 0, dp_rank: int = 0, info: Optional[Mapping[str, str]] = None
    ) -> None:
        self._labels = dict(zip(BASE_LABELS, (model_name, str(tp_rank), str(dp_rank))))
        self._info = dict(info or {})
        self._families: dict[str, object] = {}
        self._metrics: dict[str, object] = {}
        self._last: dict[str, float] = {}  # values at the last update (only changes are written)
        self._add(s for s in SERIES if not s.host_only)

    def add_host_series(self) -> None:
        """HiCache is on: series for offloads and host hits."""
        self._add(s for s in SERIES if s.host_only and s.source not in self._metrics)

    def _add(self, series: Iterable[Series]) -> None:
        for s in series:
            family = self._family(s)
            if s.source == "holds":  # one child per kind of hold, each exported from the start
                self._holds = family
                for kind in (FIRST_TURN, PAUSE):
                    family.labels(**self._labels, **{HOLD_LABEL: kind})
            elif s.source == "info":
                family.labels(**self._labels, **self._info).set(1)
            else:
                child = {s.label_name: s.label_value} if s.label else {}
                self._metrics[s.source] = family.labels(**self._labels, **child)

    def _family(self, s: Series):
        """The prometheus_client metric of ``s``'s family, made at its first row."""
        if s.short in self._families:
            return self._families[s.short]
        from prometheus_client import Counter, Gauge, Histogram

        full, doc = PREFIX + s.short, help_text(s.short)
        if s.source == "info":
            labels = (*self._labels, *self._info)
        elif s.source == "holds":
            labels = (*self._labels, HOLD_LABEL)
        else:
            labels = (*self._labels, *((s.label_name,) if s.label else ()))
        if s.kind == "gauge":
            metric = Gauge(full, doc, labels, multiprocess_mode="mostrecent")
        elif s.kind == "counter":
            metric = Counter(full, doc, labels)
        else:
            metric = Histogram(full, doc, labels, buckets=HOLD_BUCKETS if s.source == "holds" else TTL_BUCKETS)
        self._families[s.short] = metric
        return metric

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
        occupancy: Optional[Mapping[str, int]] = None,
    ) -> None:
        groups = {
            "counters": controller.counters,
            "host": controller.host.counters,
            "uploads": controller.uploads.counters,
            "admission": controller.admission,
            "sheds": controller.sheds,
            "programs": controller.program_counters,
            "identity": controller.identity,
            "holds": controller.residency.holds,
            "saver": saver,
            "exchange": exchange.counters if exchange is not None else None,
        }
        peers = exchange.peers_alive(controller.clock()) if exchange is not None else 0
        gauges = gauge_values(
            controller, held_back=held_back, oldest_wait_s=oldest_wait_s, stats_peers=peers, occupancy=occupancy
        )
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
