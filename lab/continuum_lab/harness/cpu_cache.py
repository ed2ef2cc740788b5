"""Real SGLang cache objects on CPU pools, driven turn by turn (tier-2 tests, overhead benchmark).

``TurnDriver`` does what the scheduler does with the cache (match, lock, allocate the rest with eviction, insert, unlock).

The driver stands in for the scheduler only; every cache, pool and allocator call is SGLang's own.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Optional

import torch
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import evict_from_tree_cache
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.components import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from sglang_continuum.adapter.radix_cache import ContinuumRadixCache
from sglang_continuum.core.metadata import ProgramMeta


def make_params(size: int) -> CacheInitParams:
    kv = MHATokenToKVPool(
        size=size,
        page_size=1,
        dtype=torch.float32,
        head_num=1,
        head_dim=4,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    allocator = TokenToKVPoolAllocator(size=size, dtype=torch.float32, device="cpu", kvcache=kv, need_sort=False)
    req_to_token = ReqToTokenPool(size=8, max_context_len=4096, device="cpu", enable_memory_saver=False)
    return CacheInitParams(
        disable=False,
        req_to_token_pool=req_to_token,
        token_to_kv_pool_allocator=allocator,
        page_size=1,
        tree_components=(ComponentType.FULL,),
    )


def make_cache(size: int = 256, *, continuum: bool = True, **kwargs) -> UnifiedRadixCache:
    params = make_params(size)
    return ContinuumRadixCache(params, **kwargs) if continuum else UnifiedRadixCache(params)


def key(tokens) -> RadixKey:
    return RadixKey(array("q", tokens))


@dataclass
class TurnResult:
    cached: int  # tokens of the context found in the tree when the turn started
    tokens: int
    node: object


class TurnDriver:
    def __init__(self, cache: UnifiedRadixCache) -> None:
        self.cache = cache
        self.allocator = cache.token_to_kv_pool_allocator

    def alloc(self, n: int) -> Optional[torch.Tensor]:
        if n == 0:
            return torch.empty(0, dtype=torch.int64)
        evict_from_tree_cache(self.cache, n)  # -> allocator.evict_to_free_tokens -> evict_for_alloc
        return self.allocator.alloc(n)

    def run_turn(self, meta: ProgramMeta, tokens: list[int], tool: Optional[str] = None) -> Optional[TurnResult]:
        """Serve one turn whose whole context is ``tokens``; None if memory could not be had."""
        c = self.cache
        continuum = isinstance(c, ContinuumRadixCache)
        tag = c.controller.turn_arrived(meta) if continuum else None
        m = c.match_prefix(MatchPrefixParams(key=key(tokens)))
        cached = m.device_prefix_len
        lock = c.lock(m.last_device_node)
        if continuum:
            c.turn_admitted(tag, len(tokens), cached=cached)
        new = self.alloc(len(tokens) - cached)
        if new is None:
            c.unlock(lock)
            if continuum:
                c.turn_aborted(meta)
            return None
        value = torch.cat([c.path_device_indices(m.last_device_node)[:cached].to(torch.int64), new.to(torch.int64)])
        res = c.insert(InsertParams(key=key(tokens), value=value, prev_prefix_len=cached))
        c.unlock(lock)
        node = res.last_device_node
        if continuum:
            c.turn_finished(meta, node, len(tokens), tool)
        return TurnResult(cached, len(tokens), node)

    def cached_len(self, tokens) -> int:
        return self.cache.match_prefix(MatchPrefixParams(key=key(tokens))).device_prefix_len

    def fill(self, n: int, base: int = 10**6) -> int:
        """Another program's request: allocate n slots (evicting as needed), insert, release."""
        tokens = list(range(base, base + n))
        got = self.run_turn(ProgramMeta(), tokens)
        return 0 if got is None else got.tokens
