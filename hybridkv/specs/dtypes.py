"""Cache dtypes as names, with their element sizes, without importing torch.

A spec stores its dtype as a canonical name (``"bfloat16"``, ``"float8_e4m3fn"``...).
``dtype_name`` accepts a canonical name, an alias (``"bf16"``, ``"fp16"``...) or a
``torch.dtype`` (recognised by its type, so torch is never imported here), and
returns the canonical name; ``DTYPE_BYTES`` gives its element size.
``to_torch_dtype`` is the one place a name becomes a ``torch.dtype``: it
imports torch, so only code that makes tensors calls it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# Canonical name (torch's attribute name) -> bytes of one element.
DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
}

# Other spellings users write (vLLM's ``cache_dtype`` names among them).
DTYPE_ALIASES: dict[str, str] = {
    "fp32": "float32",
    "float": "float32",
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "fp8": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
}


def _is_torch_dtype(value: Any) -> bool:
    t = type(value)
    return t.__module__ == "torch" and t.__name__ == "dtype"


def dtype_name(value: Any, field: str = "dtype") -> str:
    """The canonical name of ``value``: a name, an alias or a ``torch.dtype``.

    Raises ``ValueError`` naming ``field`` and the accepted names otherwise.
    """
    if _is_torch_dtype(value):
        name = str(value).removeprefix("torch.")
        if name in DTYPE_BYTES:
            return name
        raise ValueError(
            f"{field}={value} is not a supported cache dtype; use one of {sorted(DTYPE_BYTES)}"
        )
    if isinstance(value, str):
        key = value.lower()
        if key in DTYPE_BYTES:
            return key
        if key in DTYPE_ALIASES:
            return DTYPE_ALIASES[key]
    raise ValueError(
        f"{field}={value!r} is not a known dtype; use a torch.dtype or one of "
        f"{sorted([*DTYPE_BYTES, *DTYPE_ALIASES])}"
    )


def to_torch_dtype(value: Any, field: str = "dtype") -> torch.dtype:
    """The ``torch.dtype`` of ``value`` (anything ``dtype_name`` accepts); imports torch."""
    if _is_torch_dtype(value):
        dtype_name(value, field)  # rejects the dtypes a cache cannot hold
        return value
    import torch

    dt = getattr(torch, dtype_name(value, field))
    assert isinstance(dt, torch.dtype), dt
    return dt
