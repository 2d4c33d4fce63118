"""``ModelFingerprint``: what must match for a stored unit's bytes to be valid.

An entry written for one model is meaningless for another, for the same
model at another dtype, block size or grouping, or for another byte layout of
a unit. The fingerprint names all of them and ``digest`` hashes them into 32
bytes that the disk tier writes into every entry's header (and its folder
name): an entry whose digest differs is never a hit.

``digest`` is stable across processes and Python versions: sha256 of a
canonical JSON (sorted keys, no whitespace) of the fields; no ``hash()``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, fields, is_dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hybridkv.specs.config import KVCacheConfig

#: The version of the unit byte layout this package writes; a change in how a
#: unit's parts are laid out must change it (old entries then never hit).
UNIT_LAYOUT = "hybridkv-unit/v1"


def _canonical(value: Any) -> Any:
    """Plain JSON data for a spec field (tuples -> lists, dataclasses -> dicts)."""
    if is_dataclass(value) and not isinstance(value, type):
        out = {f.name: _canonical(getattr(value, f.name)) for f in fields(value)}
        out["__type__"] = type(value).__name__
        return out
    if isinstance(value, tuple | list):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"cannot fingerprint a {type(value).__name__}: {value!r}")


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class ModelFingerprint:
    """The identity of a unit's bytes.

    ``weights``: the weights' identity (a checkpoint's content hash or
    revision; two checkpoints must never share one); ``layout``: the unit
    byte layout (``UNIT_LAYOUT`` and anything the runner adds, e.g. the
    device page layout); ``dtypes``: the cache dtypes, sorted; ``block_size``:
    tokens per block; ``groups``: one canonical JSON string per KV cache group
    (its spec with every field, and its layer names, in group order).
    """

    weights: str
    layout: str
    dtypes: tuple[str, ...]
    block_size: int
    groups: tuple[str, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.weights, str) or not self.weights:
            raise ValueError(
                "ModelFingerprint.weights must be a non-empty string identifying the "
                f"weights (a checkpoint hash or revision), got {self.weights!r}"
            )
        if not isinstance(self.layout, str) or not self.layout:
            raise ValueError(
                f"ModelFingerprint.layout must be a non-empty string, got {self.layout!r}"
            )
        if (
            isinstance(self.block_size, bool)
            or not isinstance(self.block_size, int)
            or self.block_size < 1
        ):
            raise ValueError(
                f"ModelFingerprint.block_size must be a positive integer, got {self.block_size!r}"
            )
        if not self.groups:
            raise ValueError("ModelFingerprint.groups must describe at least one KV cache group")
        object.__setattr__(self, "dtypes", tuple(sorted(set(self.dtypes))))
        object.__setattr__(self, "groups", tuple(self.groups))

    @classmethod
    def from_kv_cache_config(
        cls, config: KVCacheConfig, weights: str, layout: str = UNIT_LAYOUT
    ) -> ModelFingerprint:
        """The fingerprint of ``config``'s groups (specs, layer names, dtypes)."""
        groups: list[str] = []
        dtypes: set[str] = set()
        block_size = config.kv_cache_groups[0].kv_cache_spec.block_size
        for group in config.kv_cache_groups:
            spec = group.kv_cache_spec
            described = _canonical(spec)
            dtypes.update(described.get("dtypes", []))
            if "dtype" in described:
                dtypes.add(described["dtype"])
            groups.append(_dumps({"layers": list(group.layer_names), "spec": described}))
        return cls(weights, layout, tuple(dtypes), block_size, tuple(groups))

    @property
    def digest(self) -> bytes:
        """32 bytes: sha256 of the canonical JSON of the fields."""
        data = {f.name: _canonical(getattr(self, f.name)) for f in fields(self)}
        return hashlib.sha256(_dumps(data).encode("utf-8")).digest()

    @property
    def hex(self) -> str:
        """``digest`` in hex (64 characters)."""
        return self.digest.hex()
