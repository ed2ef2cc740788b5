"""HiCache as Continuum uses it: the only module that reaches into SGLang's host tier.

SGLang 0.5.23 keeps the host tier inside ``UnifiedRadixCache`` (``init_hicache``): a host pool,
a ``HybridCacheController`` that copies device<->host, and per-node host state in the tree. Continuum
needs four operations from it, each a thin call into that machinery:

* ``back_up(node)``: give a node's whole path a host copy. Under ``write_through`` it already has
  one (backed up at insert); under ``write_through_selective`` and ``write_back`` an unbacked path
  is copied now -- asynchronously through the same write-through action ``insert`` issues (the
  path stays device-locked until the copy is acknowledged), or synchronously (one node at a time,
  SGLang's own write-back eviction step) when the device memory is needed right away.
* ``host_lock`` / ``host_unlock``: protect the host copy from host eviction (``host_lock_ref`` on
  the path's last node; host eviction only takes unlocked host leaves, so the path is safe).
* ``load_ahead(node)``: predictive upload, SGLang's own ``load_back`` of a host-only path called
  ahead of the request that will need it. The copy is queued, not started: the next prefill batch
  starts it with its own loads (``ready_to_load_host_cache``) and waits on it layer by layer, as it
  waits on the loads it made itself, so no batch reads the path before its KV has landed, and no
  transfer slot is taken beyond the one per batch SGLang counts on.
* ``reload_cost()``: the transfer-time model, from the host pool's bytes per token.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from sglang_continuum.core.offload import DEFAULT_HOST_BYTES_PER_S, ReloadCost

if TYPE_CHECKING:
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    from sglang_continuum.core.upload import Uploads

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class HostLock:
    """A host pin's engine handle: the protected node and the receipt that unlocks it."""

    node: int
    receipt: Any


class HostTier:
    def __init__(self, cache: "UnifiedRadixCache") -> None:
        self.cache = cache
        controller = cache.cache_controller
        self.write_policy: str = controller.write_policy
        host = controller.mem_pool_host
        self.capacity_tokens = int(host.size)
        self.bytes_per_token = int(host.anchor_entry.host_pool.size_per_token)
        self.device_tokens = int(cache.token_to_kv_pool_allocator.size)

    @classmethod
    def attach(cls, cache: "UnifiedRadixCache") -> Optional["HostTier"]:
        """The host tier of ``cache``, or None without HiCache (or in modes we do not drive:
        buffer-only host memory, an external cache linker)."""
        if getattr(cache, "cache_controller", None) is None:
            return None
        if getattr(cache, "host_memory_mode", "cache") != "cache" or getattr(cache, "linker", None) is not None:
            logger.warning("continuum: HiCache mode without a host cache tier; pins are not offloaded")
            return None
        return cls(cache)

    def reload_cost(self, bytes_per_s: Optional[float]) -> ReloadCost:
        return ReloadCost(self.bytes_per_token, bytes_per_s or DEFAULT_HOST_BYTES_PER_S)

    @property
    def distinct_capacity_tokens(self) -> int:
        """How much KV the two tiers hold together: under ``write_back`` the host keeps what left
        the device (device + host); under ``write_through`` (and ``_selective``) it mirrors the
        device, so the larger of the two."""
        if self.write_policy == "write_back":
            return self.device_tokens + self.capacity_tokens
        return max(self.device_tokens, self.capacity_tokens)

    @property
    def hold_cost(self) -> float:
        """Holding a token on host, relative to holding it on the device: device pool / host pool."""
        return self.device_tokens / max(1, self.capacity_tokens)

    # -- offload -------------------------------------------------------------------------
    def back_up(self, node: int, *, sync: bool) -> bool:
        """Make sure the path to ``node`` has (or is getting) a host copy; False if the host pool
        could not take it."""
        tree = self.cache.tree_core
        if tree.is_backuped(node):
            return True
        action = tree.build_backup_kv_action(node)  # unbacked ancestors first, then node
        if sync:
            for node_id in action.node_ids:
                if not tree.is_backuped(node_id) and not self.cache.backup_node_for_write_back(node_id):
                    return False
        else:
            self.cache._apply_cache_actions([action])
        return tree.is_backuped(node)

    def host_lock(self, node: int) -> Optional[HostLock]:
        if not self.cache.tree_core.is_backuped(node):
            return None
        return HostLock(node, self.cache.inc_host_lock_ref(node).to_dec_params())

    def host_unlock(self, lock: HostLock) -> None:
        self.cache.dec_host_lock_ref(lock.node, lock.receipt)

    def on_device(self, node: int) -> bool:
        return not self.cache.tree_core.is_full_device_evicted(node)

    # -- upload --------------------------------------------------------------------------
    def upload(self, uploads: "Uploads", now: float, room_tokens: int, contended: bool) -> list:
        """The host copies ``uploads`` says are due back (``core/upload.py``), each loaded ahead
        under a device lock that becomes its program's pin. Returns the pins to release (the
        host pins they replace)."""
        release = []
        for upload in uploads.due(now, room_tokens, contended=contended):
            node = upload.host.handle.node
            if self.on_device(node):
                uploads.postpone(upload, now)
                continue
            try:
                moved = self.load_ahead(node, room_tokens)
            except Exception:  # never let an upload take serving down: the return loads it itself
                logger.exception("continuum: upload of program=%s failed", upload.host.program_id)
                moved = None
            if moved is None:
                uploads.failed(upload)
                continue
            room_tokens -= upload.host.tokens
            release += uploads.uploaded(upload, self.cache.lock(node), now)
            logger.debug("continuum: uploaded program=%s tokens=%d", upload.host.program_id, moved)
        return release

    def load_ahead(self, node: int, room_tokens: int) -> Optional[int]:
        """Bring the path to ``node`` back to the device ahead of its request, within ``room_tokens``
        (free, or unlocked cache SGLang evicts for it): the tokens queued for loading (0: it is
        resident already), or None if SGLang would not load it now."""
        if self.on_device(node):
            return 0
        if not self.cache.tree_core.is_backuped(node):
            return None
        loading = len(self.cache.cache_controller.load_queue)
        if not self.cache.load_back(node, mem_quota=room_tokens):
            return None
        queued = self.cache.cache_controller.load_queue[loading:]
        return sum(len(getattr(op, "host_indices", ())) for op in queued)
