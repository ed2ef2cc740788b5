"""``ContinuumRuntime``: the plugin's services for one scheduler, beside its cache.

Tool statistics saved for a warm start and shared with peer workers, the per-request event log,
program ids inferred from the prefix, and the Prometheus series. The binding composes them once
per scheduler (``start``), as mini-sglang's scheduler composes its managers; until then (and for a
cache built on its own, as the lab's CPU harness does) every service is off. The cache reads the
ones a request's life needs (inference, the event log, the TTL histogram) and executes the pins.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, Optional

from sglang.srt.runtime_context import get_parallel, get_serving

from sglang_continuum.adapter.inference import ProgramInference
from sglang_continuum.adapter.metrics import ContinuumMetrics, info_labels
from sglang_continuum.adapter.request import get_tag
from sglang_continuum.core.event_log import EventLog
from sglang_continuum.core.persistence import StatsSaver, load_stats
from sglang_continuum.core.stats_endpoints import rank_endpoint, read_keys
from sglang_continuum.core.stats_exchange import StatsExchange

if TYPE_CHECKING:
    from sglang_continuum.core.controller import ContinuumController
    from sglang_continuum.core.settings import ContinuumSettings

logger = logging.getLogger(__name__)

METRICS_INTERVAL_S = 0.5  # queue-scanning gauges are recomputed at most this often


class ContinuumRuntime:
    def __init__(self) -> None:
        self.controller = None
        self.clock: Callable[[], float] = lambda: 0.0
        self.saver: Optional[StatsSaver] = None
        self.event_log: Optional[EventLog] = None
        self.exchange: Optional[StatsExchange] = None
        self.inference: Optional[ProgramInference] = None
        self.metrics: Optional[ContinuumMetrics] = None
        # the KV pool with what only pins hold set apart (set by the binding; None: not known)
        self.occupancy: Optional[Callable[[], dict[str, int]]] = None
        self._occupancy: dict[str, int] = {}
        self._next_stats_save = 0.0
        self._next_metrics = 0.0
        self._oldest_wait = 0.0
        self._held_back = 0

    @classmethod
    def start(
        cls,
        settings: "ContinuumSettings",
        controller: "ContinuumController",
        clock: Callable[[], float],
        *,
        tp_rank: int,
        tp_size: int,
        pp_rank: int,
        enable_metrics: bool,
        host_tier: bool,
        single_shot: Callable[[str], None],
    ) -> "ContinuumRuntime":
        """The services ``settings`` ask for. One writer per server (tensor- and pipeline-parallel
        rank 0) saves statistics and logs events; ``host_tier``: HiCache is on (its series too);
        ``single_shot``: what prefix inference calls for a first turn found not to be a program."""
        rt = cls()
        rt.controller, rt.clock = controller, clock
        writer = tp_rank == 0 and pp_rank == 0
        if settings.stats_path:
            load_stats(controller, settings.stats_path)
            rt.saver = StatsSaver(settings.stats_path) if writer else None
        rt._next_stats_save = rt.clock() + controller.timings.stats_save_interval_s
        if settings.event_log and writer:
            rt.event_log = EventLog(settings.event_log)
        rt.exchange = rt._start_exchange(settings, tp_size)
        if settings.infer_programs:
            rt.inference = ProgramInference(
                controller.programs.__contains__, rt.clock, event_log=rt.event_log, single_shot=single_shot
            )
        if enable_metrics:
            rt.metrics = ContinuumMetrics(
                # labelled as SGLang's own scheduler series are, so its dashboards' filters apply
                model_name=get_serving().served_model_name,
                tp_rank=tp_rank,
                dp_rank=_dp_rank(),
                info=info_labels(controller),
            )
            if host_tier:
                rt.metrics.add_host_series()
        return rt

    def _start_exchange(self, settings, tp_size: int) -> Optional[StatsExchange]:
        """Tool statistics shared with peer workers, when endpoints are set. Only with one
        scheduler per server: tensor-parallel ranks must take identical pin decisions, and peers'
        samples would reach only the rank that receives them. Each data-parallel rank is a worker
        of its own, on an endpoint derived from the configured one (``rank_endpoint``)."""
        s = settings
        if not (s.stats_publish_endpoint or s.stats_peer_endpoints):
            return None
        if tp_size > 1:
            logger.warning("continuum: shared tool statistics are off: they need tp_size 1 (got %d)", tp_size)
            return None
        dp_rank, dp_size = _dp_rank(), get_parallel().num_dp_ranks
        try:
            keys = read_keys(s.stats_key_file) if s.stats_key_file else None
            exchange = StatsExchange(
                s.stats_publish_endpoint, s.stats_peer_endpoints, keys=keys, dp_rank=dp_rank, dp_size=dp_size
            )
        except Exception as exc:  # e.g. the publish port is taken: serve on, with local statistics only
            logger.error("continuum: shared tool statistics are off: %s", exc)
            return None
        self.controller.share_sample = exchange.record
        logger.info(
            "continuum: sharing tool statistics (publish %s, %d peer endpoint(s), dp rank %d of %d, %s)",
            rank_endpoint(s.stats_publish_endpoint, dp_rank) if s.stats_publish_endpoint else "-",
            len(s.stats_peer_endpoints),
            dp_rank,
            dp_size,
            "CURVE keys" if keys else "this host only",
        )
        return exchange

    def exchange_stats(self, now: float) -> None:
        """Publish this worker's new tool samples and merge its peers' (non-blocking; between
        exchange intervals one comparison)."""
        if self.exchange is not None:
            samples = self.exchange.poll(now)
            if samples:
                self.controller.merge_peer_samples(samples)

    def step(self, now: float) -> None:
        """Once per scheduler iteration: share statistics, and hand them to the saver when due."""
        self.exchange_stats(now)
        if self.saver is not None and now >= self._next_stats_save:
            self._next_stats_save = now + self.controller.timings.stats_save_interval_s
            self.saver.submit(self.controller.snapshot())

    def publish_metrics(self, waiting_queue, *, force: bool = False) -> None:
        """Refresh the Prometheus series (only values that changed are written): at most every
        ``METRICS_INTERVAL_S`` while serving, so a decode step pays nothing for them, and at
        every call with ``force`` (the idle loop: /metrics is current whenever the engine rests)."""
        if self.metrics is None:
            return
        now = self.clock()
        due = now >= self._next_metrics
        if not (due or force):
            return
        if due:
            self._next_metrics = now + METRICS_INTERVAL_S
            tags = [tag for tag in map(get_tag, waiting_queue) if tag is not None]
            self._oldest_wait = now - min(tag.arrival for tag in tags) if tags else 0.0
            programs = self.controller.programs
            self._held_back = sum(
                1
                for tag in tags
                if tag.held_back
                and (state := programs.get(tag.meta.program_id)) is not None
                and state.turns_admitted == 0
            )
            self._occupancy = self.occupancy() if self.occupancy is not None else {}
        self.metrics.update(
            self.controller,
            self.saver,
            self.exchange,
            held_back=self._held_back,
            oldest_wait_s=self._oldest_wait,
            occupancy=self._occupancy,
        )

    def save_stats_now(self) -> None:
        """Synchronous save (shutdown paths); never raises."""
        if self.saver is not None:
            self.saver.flush(timeout_s=2.0)
            self.saver.save_now(self.controller.snapshot())

    def check_integrity(self) -> None:
        if self.inference is not None:
            self.inference.check_integrity()
        if self.exchange is not None:
            self.exchange.check_integrity()

    def close(self) -> None:
        self.save_stats_now()  # warm start for the next server
        if self.event_log is not None:
            self.event_log.close()
        if self.exchange is not None:
            self.exchange.close()
            self.exchange = None


def _dp_rank() -> int:
    """This scheduler's data-parallel rank, read as SGLang's scheduler reads it (None: no DP
    controller, one rank)."""
    return get_parallel().dp_rank or 0
