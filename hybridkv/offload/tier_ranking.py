"""The engine's tier rankings: ``tiers/ranking.py``'s rule with the numbers the
simulator gives it (``sim/tier_model.py``), so both evict the same units.

Under a policy that ranks tiers (``CachePolicy.ranks_tiers``: ``hybrid``) the
weight is the device free set's value weight, and a unit's class is its value
per device page (``CachePolicy.demotion_value``: with the return bonus's reach
in tokens, its return factor rescaled to the host's own bonus) shifted to its
own bytes against one block id's bytes across every buffer
(``policy.unit_class``). A
hit on a host unit moves it to spare room (the device holds it until it
demotes it again); a disk unit is re-keyed. Under ``lru`` there is no rule: every tier is plain LRU.
"""

from __future__ import annotations

from functools import partial

from hybridkv.cache_manager.kv_cache_manager import KVCacheManager
from hybridkv.policy import unit_class
from hybridkv.tiers import RankRule


def tier_weight(manager: KVCacheManager) -> float:
    """The lower tiers' value weight: the device free set's (0 without one: LRU).
    The host's own return bonus is in the units' values, not in the weight
    (``HybridPolicy.demotion_value``), so every other class step of a tier is
    the device's. The engine's rules and the simulator's tiers both take it
    from here."""
    return float(getattr(manager.block_pool.policy, "weight", 0.0))


def tier_rules(manager: KVCacheManager) -> tuple[RankRule, RankRule] | None:
    """``(host rule, disk rule)`` for ``manager``'s tiers; None: plain LRU."""
    if not manager.policy.ranks_tiers:
        return None
    config = manager.kv_cache_config
    if not config.kv_cache_tensors:
        raise ValueError("a ranked tier needs the KV buffers' sizes: kv_cache_tensors is empty")
    page_bytes = sum(t.size for t in config.kv_cache_tensors) // config.num_blocks
    weight = tier_weight(manager)
    classify = partial(unit_class, page_bytes=page_bytes)
    return RankRule(weight, classify, hits_to_spare=True), RankRule(weight, classify)
