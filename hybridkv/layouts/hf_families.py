"""Per-family readers of Hugging Face configs: one layer kind per decoder layer.

A reader takes a *text* config (multimodal wrappers already unwrapped) and
returns one ``LayerKind`` per layer. Readers prefer ``config.layer_types``
(transformers 5 fills it for most families) and fall back to the fields older
configs carry (``sliding_window_pattern``, ``no_rope_layers``,
``attn_layer_period``/``attn_layer_offset``, ``attn_layer_indices``...), so a
config.json written by any transformers version imports the same way. Every
field is read with ``getattr`` and a fallback, for transformers 5.17 and later.

Readers raise ``ValueError`` naming the config field and what was expected.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hybridkv.layouts.kinds import (
    ChunkedLocalLayer,
    FullAttentionLayer,
    LayerKind,
    Mamba1Layer,
    Mamba2Layer,
    SlidingWindowLayer,
)

HFConfig = Any
"""A ``transformers.PretrainedConfig`` (typed loosely: fields vary by family)."""

Reader = Callable[[HFConfig], list[LayerKind]]

# Spellings of layer types across transformers versions and config.json files.
_FULL = ("full_attention", "attention")
_SLIDING = ("sliding_attention",)
_CHUNKED = ("chunked_attention",)
_MAMBA = ("mamba", "linear_attention")  # only read by the Mamba-hybrid families


def _family(config: HFConfig) -> str:
    return str(getattr(config, "model_type", type(config).__name__))


def _positive_int(config: HFConfig, field: str) -> int:
    value = getattr(config, field, None)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{_family(config)} config: '{field}' must be a positive integer, got {value!r}"
        )
    return value


def _num_layers(config: HFConfig) -> int:
    return _positive_int(config, "num_hidden_layers")


def _declared(config: HFConfig, field: str = "layer_types") -> list[str] | None:
    """``config.<field>`` as a list of strings checked against the layer count."""
    value = getattr(config, field, None)
    if value is None:
        return None
    types = [str(t) for t in value]
    if len(types) != _num_layers(config):
        raise ValueError(
            f"{_family(config)} config: '{field}' lists {len(types)} layers but "
            f"num_hidden_layers is {_num_layers(config)}"
        )
    return types


def _periodic(n: int, period: int) -> list[str]:
    """Sliding layers with every ``period``-th layer full (Gemma 3, Cohere 2, gpt-oss)."""
    return ["sliding_attention" if (i + 1) % period else "full_attention" for i in range(n)]


def _attention(config: HFConfig) -> FullAttentionLayer:
    """A full-attention layer with the config's KV heads and head size."""
    heads = _positive_int(config, "num_attention_heads")
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None)
    if head_dim is None:
        head_dim = _positive_int(config, "hidden_size") // heads
    return FullAttentionLayer(num_kv_heads=kv_heads, head_dim=head_dim)


def _map_types(
    config: HFConfig, types: Sequence[str], kinds: dict[str, Callable[[], LayerKind]]
) -> list[LayerKind]:
    """One kind per layer type; ``kinds`` maps each accepted spelling to a factory."""
    made: dict[str, LayerKind] = {}
    out: list[LayerKind] = []
    for i, t in enumerate(types):
        if t not in kinds:
            raise ValueError(
                f"{_family(config)} config: layer_types[{i}] is {t!r}; expected one of "
                f"{sorted(kinds)}"
            )
        if t not in made:
            made[t] = kinds[t]()
        out.append(made[t])
    return out


def _sliding(config: HFConfig) -> SlidingWindowLayer:
    full = _attention(config)
    window = _positive_int(config, "sliding_window")
    return SlidingWindowLayer(
        num_kv_heads=full.num_kv_heads, head_dim=full.head_dim, sliding_window=window
    )


def _sliding_or_full(config: HFConfig, types: Sequence[str]) -> list[LayerKind]:
    factories: dict[str, Callable[[], LayerKind]] = {t: lambda: _attention(config) for t in _FULL}
    factories.update({t: lambda: _sliding(config) for t in _SLIDING})
    return _map_types(config, types, factories)


def _pattern_reader(default_period: int) -> Reader:
    """Families whose every ``period``-th layer is full, the rest sliding."""

    def read(config: HFConfig) -> list[LayerKind]:
        types = _declared(config)
        if types is None:
            period = (
                getattr(config, "sliding_window_pattern", None)
                or getattr(config, "_sliding_window_pattern", None)
                or default_period
            )
            types = _periodic(_num_layers(config), int(period))
        return _sliding_or_full(config, types)

    return read


def read_gemma3_text(config: HFConfig) -> list[LayerKind]:
    """Gemma 3: five sliding layers, then one full (``sliding_window_pattern`` 6)."""
    if getattr(config, "use_bidirectional_attention", False):
        raise ValueError(
            "gemma3_text config: use_bidirectional_attention is set (an embedding "
            "model); it generates no tokens and keeps no KV cache to manage"
        )
    return _pattern_reader(6)(config)


read_cohere2 = _pattern_reader(4)
"""Cohere 2 (Command R7B): three sliding layers, then one full layer."""

read_gpt_oss = _pattern_reader(2)
"""gpt-oss: sliding and full layers alternate, starting with sliding."""


def read_mistral(config: HFConfig) -> list[LayerKind]:
    """Mistral: one window for every layer; ``sliding_window: null`` means full."""
    types = _declared(config)
    if types is None:
        slides = getattr(config, "sliding_window", None) is not None
        types = [_SLIDING[0] if slides else _FULL[0]] * _num_layers(config)
    return _sliding_or_full(config, types)


read_ministral = read_mistral
"""Ministral: ``layer_types`` when given, else Mistral's one-window rule."""


def read_llama4_text(config: HFConfig) -> list[LayerKind]:
    """Llama 4: chunked-local layers; NoPE layers (``no_rope_layers`` 0) attend fully."""
    types = _declared(config)
    if types is None:
        no_rope = getattr(config, "no_rope_layers", None)
        if not no_rope:
            interval = int(getattr(config, "no_rope_layer_interval", None) or 4)
            no_rope = [int((i + 1) % interval != 0) for i in range(_num_layers(config))]
        if len(no_rope) != _num_layers(config):
            raise ValueError(
                f"llama4_text config: 'no_rope_layers' lists {len(no_rope)} layers but "
                f"num_hidden_layers is {_num_layers(config)}"
            )
        types = [_CHUNKED[0] if uses_rope else _FULL[0] for uses_rope in no_rope]

    def chunked() -> LayerKind:
        full = _attention(config)
        if getattr(config, "attention_chunk_size", None) is None:
            return full  # transformers: no chunk size, every layer attends globally
        return ChunkedLocalLayer(
            num_kv_heads=full.num_kv_heads,
            head_dim=full.head_dim,
            attention_chunk_size=_positive_int(config, "attention_chunk_size"),
        )

    factories: dict[str, Callable[[], LayerKind]] = {t: lambda: _attention(config) for t in _FULL}
    factories.update({t: chunked for t in _CHUNKED})
    return _map_types(config, types, factories)


def _mamba_or_attention(
    config: HFConfig, types: Sequence[str], mamba: Callable[[], LayerKind]
) -> list[LayerKind]:
    factories: dict[str, Callable[[], LayerKind]] = {t: lambda: _attention(config) for t in _FULL}
    factories.update({t: mamba for t in _MAMBA})
    return _map_types(config, types, factories)


def _hybrid_types(config: HFConfig) -> list[str] | None:
    return _declared(config) or _declared(config, "layers_block_type")


def read_jamba(config: HFConfig) -> list[LayerKind]:
    """Jamba: attention where ``i % attn_layer_period == attn_layer_offset``, else Mamba1.

    Jamba's ``sliding_window`` field is ignored, as transformers' Jamba ignores it.
    """
    types = _hybrid_types(config)
    if types is None:
        period = _positive_int(config, "attn_layer_period")
        offset = int(getattr(config, "attn_layer_offset", 0))
        types = [
            _FULL[0] if i % period == offset else _MAMBA[0] for i in range(_num_layers(config))
        ]

    def mamba() -> LayerKind:
        expand = _positive_int(config, "mamba_expand")
        return Mamba1Layer(
            d_state=_positive_int(config, "mamba_d_state"),
            d_conv=_positive_int(config, "mamba_d_conv"),
            d_inner=expand * _positive_int(config, "hidden_size"),
        )

    return _mamba_or_attention(config, types, mamba)


def _mamba2(config: HFConfig) -> Mamba2Layer:
    n_heads = _positive_int(config, "mamba_n_heads")
    head_dim = getattr(config, "mamba_d_head", None)
    if head_dim in (None, "auto"):
        expand = _positive_int(config, "mamba_expand")
        head_dim = expand * _positive_int(config, "hidden_size") // n_heads
    return Mamba2Layer(
        n_heads=n_heads,
        head_dim=head_dim,
        n_groups=getattr(config, "mamba_n_groups", None) or 1,
        d_state=_positive_int(config, "mamba_d_state"),
        d_conv=_positive_int(config, "mamba_d_conv"),
    )


def read_bamba(config: HFConfig) -> list[LayerKind]:
    """Bamba: attention on ``attn_layer_indices``, Mamba2 elsewhere."""
    types = _hybrid_types(config)
    if types is None:
        indices = set(getattr(config, "attn_layer_indices", None) or ())
        types = [_FULL[0] if i in indices else _MAMBA[0] for i in range(_num_layers(config))]
    return _mamba_or_attention(config, types, lambda: _mamba2(config))


def read_granitemoehybrid(config: HFConfig) -> list[LayerKind]:
    """GraniteMoeHybrid (Granite 4.0 H): ``layer_types`` of "mamba" and "attention"."""
    types = _hybrid_types(config)
    if types is None:
        raise ValueError(
            "granitemoehybrid config: neither 'layer_types' nor 'layers_block_type' is "
            "set; give one entry per layer ('mamba' or 'attention')"
        )
    return _mamba_or_attention(config, types, lambda: _mamba2(config))


READERS: dict[str, Reader] = {
    "gemma3_text": read_gemma3_text,
    "cohere2": read_cohere2,
    "gpt_oss": read_gpt_oss,
    "mistral": read_mistral,
    "ministral": read_ministral,
    "llama4_text": read_llama4_text,
    "jamba": read_jamba,
    "bamba": read_bamba,
    "granitemoehybrid": read_granitemoehybrid,
}
"""model_type of a text config -> its reader."""

WRAPPERS: dict[str, str] = {"gemma3": "gemma3_text", "llama4": "llama4_text"}
"""Multimodal model_type -> the model_type of its ``text_config``."""

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted({*READERS, *WRAPPERS}))
