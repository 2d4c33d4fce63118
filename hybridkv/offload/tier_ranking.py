"""The engine's tier rankings: ``tiers/ranking.py``'s rule with the numbers the
simulator gives it (``sim/tier_model.py``), so both evict the same units.

Under a policy that ranks tiers (``CachePolicy.ranks_tiers``: ``hybrid``) the
weight is the device free set's value weight times the policy's
``host_weight_scale`` (1.0 unless the return bonus has a reach in tokens),
and a unit's class is its value per device page shifted to its own bytes
against one block id's bytes across every buffer (``policy.unit_class``). A
hit on a host unit moves it to spare room (the device holds it until it
demotes it again); a disk unit is re-keyed. Under ``lru`` there is no rule: every tier is plain LRU.
"""

from __future__ import annotations

from functools import partial

from hybridkv.cache_manager.kv_cache_manager import KVCacheManager
from hybridkv.policy import unit_class
from hybridkv.tiers import RankRule


def tier_weight(manager: KVCacheManager) -> float:
    """The lower tiers' value weight: the device free set's (0 without one: LRU),
    times the policy's ``host_weight_scale`` (the tiers' own return bonus when it
    has a reach in tokens; 1.0: off). The engine's rules and the simulator's
    tiers both take it from here."""
    weight = float(getattr(manager.block_pool.policy, "weight", 0.0))
    return weight * manager.policy.host_weight_scale


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
