"""Memory planning: page-size unification, grouping, KVCacheConfig, buffers."""
