"""Our planned ``KVCacheConfig`` as vLLM 0.33 would build it: same specs, groups, blocks.

``to_vllm_config(ours, vl, retention)``:

1. every layer's spec in vLLM's classes, in layer order (``FullAttentionSpec``,
   ``SlidingWindowSpec``; ``MambaSpec`` in ``mamba_cache_mode="align"``, the
   mode vLLM derives from ``enable_prefix_caching``, with our padded page);
2. vLLM's own grouping on them: ``kv_cache_planning.get_kv_cache_groups``'s
   path for these layouts, i.e. one group when ``is_kv_cache_spec_uniform``,
   else ``unify_kv_cache_spec_page_size`` then
   ``_get_kv_cache_groups_uniform_page_size`` (both executed from vLLM's source
   file, see ``vllm_ref.source.source_functions``). Unification must leave every
   spec as it is (our pages are already equal): that is the check that vLLM
   accepts our block sizes and Mamba padding;
3. ``KVCacheConfig(num_blocks=ours, ...)`` with one backing tensor per layer
   (the scheduler-side manager never reads them) and the chosen
   ``prefix_cache_retention_interval``.

``check_same_grouping`` compares vLLM's groups with ours (layer sets and
specs); ``block_sizes`` reproduces ``kv_cache_utils.resolve_kv_cache_block_sizes``
for prefix caching without ``prefix_match_unit``: scheduler block size the LCM
of the group block sizes, hash block size their GCD (one group: its block size).
``vllm_mamba_block_size`` is vLLM's platform rule for the attention block size of
a Mamba hybrid (``platforms/interface.py``): the smallest multiple of the
attention kernel's 16-token block whose attention page holds one Mamba state.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

from hybridkv.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    MambaSpec,
    SlidingWindowSpec,
)
from hybridkv.specs.dtypes import to_torch_dtype

PLANNING_FUNCTIONS = (
    "create_kv_cache_group_specs",
    "is_kv_cache_spec_uniform",
    "unify_kv_cache_spec_page_size",
    "_get_kv_cache_groups_uniform_page_size",
)
#: FlashAttention's smallest kernel block (tokens), vLLM's default attention backend.
KERNEL_BLOCK_ALIGNMENT = 16


def layer_specs(config: KVCacheConfig) -> dict[str, Any]:
    """Our spec of every layer, in layer order (``layers.{i}``)."""
    specs = {name: g.kv_cache_spec for g in config.kv_cache_groups for name in g.layer_names}
    return dict(sorted(specs.items(), key=lambda kv: int(kv[0].rsplit(".", 1)[1])))


def vllm_spec(spec: Any, vl: SimpleNamespace) -> Any:
    """One of our specs in vLLM's classes."""
    ki = vl.kv_cache_interface
    if isinstance(spec, MambaSpec):
        return ki.MambaSpec(
            block_size=spec.block_size,
            shapes=spec.shapes,
            dtypes=tuple(to_torch_dtype(d) for d in spec.dtypes),
            page_size_padded=spec.page_size_padded,
            mamba_type=getattr(vl.MambaAttentionBackendEnum, spec.mamba_type.upper()),
            mamba_cache_mode="align",
        )
    attn = dict(
        block_size=spec.block_size,
        num_kv_heads=spec.num_kv_heads,
        head_size=spec.head_size,
        dtype=to_torch_dtype(spec.dtype),
    )
    if isinstance(spec, SlidingWindowSpec):
        return ki.SlidingWindowSpec(sliding_window=spec.sliding_window, **attn)
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return ki.ChunkedLocalAttentionSpec(attention_chunk_size=spec.attention_chunk_size, **attn)
    if isinstance(spec, FullAttentionSpec):
        return ki.FullAttentionSpec(**attn)
    raise TypeError(f"no vLLM spec for {type(spec).__name__}")


def vllm_grouping(vl: SimpleNamespace, specs: dict[str, Any]) -> list[Any]:
    """vLLM's ``KVCacheGroupSpec``s for per-layer vLLM specs (module docstring, step 2)."""
    path = vl.src / "vllm" / "v1" / "core" / "kv_cache_planning.py"
    from vllm_ref.source import source_functions

    ns: dict[str, Any] = dict(vars(vl.kv_cache_interface))
    ns.update(
        defaultdict=defaultdict,
        replace=dataclasses.replace,
        cdiv=vl.cdiv,
        logger=logging.getLogger("vllm.kv_cache_planning"),
    )
    fns = source_functions(path, PLANNING_FUNCTIONS, ns)
    if fns["is_kv_cache_spec_uniform"](specs):
        return fns["create_kv_cache_group_specs"](specs, [list(specs)])
    unified = fns["unify_kv_cache_spec_page_size"](specs)
    changed = [name for name in specs if unified[name] != specs[name]]
    if changed:
        raise ValueError(
            f"vLLM's page-size unification changes {len(changed)} layers' specs "
            f"(first: {changed[0]}: {specs[changed[0]]} -> {unified[changed[0]]})"
        )
    return list(fns["_get_kv_cache_groups_uniform_page_size"](unified))


def check_same_grouping(ours: KVCacheConfig, groups: list[Any], vl: SimpleNamespace) -> str:
    """``""`` when vLLM's groups are ours (as layer sets with equal specs), else why not."""
    mine = {frozenset(g.layer_names): vllm_spec(g.kv_cache_spec, vl) for g in ours.kv_cache_groups}
    theirs = {frozenset(g.layer_names): g.kv_cache_spec for g in groups}
    if mine == theirs:
        return ""
    return (
        f"vLLM groups the layers differently: {len(theirs)} groups of "
        f"{sorted(len(s) for s in theirs)} layers, ours {len(mine)} of "
        f"{sorted(len(s) for s in mine)}"
    )


def to_vllm_config(ours: KVCacheConfig, vl: SimpleNamespace, retention: int | None) -> Any:
    """vLLM's ``KVCacheConfig`` for ``ours``: vLLM's groups, our ``num_blocks``."""
    ki = vl.kv_cache_interface
    specs = {name: vllm_spec(s, vl) for name, s in layer_specs(ours).items()}
    groups = vllm_grouping(vl, specs)
    n = ours.num_blocks
    tensors = [
        ki.KVCacheTensor(
            size=g.kv_cache_spec.page_size_bytes * n,
            layers=[name],
            layer_stride=g.kv_cache_spec.page_size_bytes * n,
            block_stride=g.kv_cache_spec.page_size_bytes,
        )
        for g in groups
        for name in g.layer_names
    ]
    return ki.KVCacheConfig(
        num_blocks=n,
        kv_cache_tensors=tensors,
        kv_cache_groups=groups,
        prefix_cache_retention_interval=retention,
    )


def block_sizes(config: Any) -> tuple[int, int]:
    """``(scheduler_block_size, hash_block_size)`` as vLLM resolves them (docstring)."""
    sizes = [g.kv_cache_spec.block_size for g in config.kv_cache_groups]
    if len(sizes) == 1:
        return sizes[0], sizes[0]
    return math.lcm(*sizes), math.gcd(*sizes)


def vllm_mamba_block_size(attn_bytes_per_token: int, mamba_state_bytes: int) -> int:
    """vLLM's attention block size for a Mamba hybrid (module docstring)."""
    k = KERNEL_BLOCK_ALIGNMENT
    return k * -(-mamba_state_bytes // (k * attn_bytes_per_token))


def check_block_size(ours: KVCacheConfig) -> str:
    """``""`` when our Mamba hybrid's block size is what vLLM's platform rule picks."""
    specs = [g.kv_cache_spec for g in ours.kv_cache_groups]
    mambas = [s for s in specs if isinstance(s, MambaSpec)]
    attns = [s for s in specs if not isinstance(s, MambaSpec)]
    if not mambas or not attns:
        return ""
    per_token = attns[0].page_size_bytes // attns[0].block_size
    want = vllm_mamba_block_size(per_token, max(m.state_size_bytes for m in mambas))
    got = attns[0].block_size
    return "" if want == got else f"vLLM would pick block size {want}, ours is {got}"
