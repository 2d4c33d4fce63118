"""Token id checks shared by ``Request`` and the engine's prompts (one rule for both).

A token id is an integer in ``[0, 2**32)``: a Python ``int`` or a numpy integer
(anything with ``__index__``), never a ``bool`` (``True`` is not token 1) and
never a float or a str. Violations raise ``ValueError`` naming the field.

The checks stay C-speed on long prompts: ``array("I", ids)`` rejects
non-integers and out-of-range values in one pass, and since a ``bool`` packs as
0 or 1, only the items packed as 0 or 1 are looked at in Python.
"""

from __future__ import annotations

import functools
import operator
from array import array
from collections.abc import Iterable
from types import ModuleType
from typing import Any

TOKEN_ID_LIMIT = 2**32


#: Below this length Python's ``min`` beats numpy's fixed call cost.
_NUMPY_MIN_FROM = 64


@functools.cache
def _numpy() -> ModuleType | None:
    """numpy when installed (the ``engine`` extra), imported at the first long id list.

    The core does not depend on numpy: without it ``min`` gives the same
    answer, only slower on long prompts.
    """
    try:
        import numpy
    except ModuleNotFoundError:
        return None
    return numpy


def _zeros_and_ones(packed: array[int]) -> list[int]:
    """Positions of the packed 0s and 1s (where a bool could have been)."""
    np = _numpy() if len(packed) >= _NUMPY_MIN_FROM else None
    if np is None:
        return [i for i, t in enumerate(packed) if t <= 1] if min(packed) <= 1 else []
    return np.flatnonzero(np.frombuffer(packed, dtype=np.uint32) <= 1).tolist()


def pack_token_ids(ids: list[Any], field: str) -> array[int]:
    """``ids`` (a list) checked and packed as uint32; ``ValueError`` naming ``field``."""
    try:
        packed = array("I", ids)
    except (OverflowError, TypeError) as e:
        raise ValueError(f"{field} must be ints in [0, 2**32): {e}") from None
    if packed:
        bad = [ids[i] for i in _zeros_and_ones(packed) if isinstance(ids[i], bool)]
        if bad:
            raise ValueError(f"{field} must be ints in [0, 2**32), not bools: got {bad[:5]}")
    return packed


def token_id(value: Any, field: str) -> int:
    """One token id as a plain ``int`` (numpy ints accepted, bools refused)."""
    if type(value) is not int:
        if isinstance(value, bool):
            raise ValueError(f"{field} must be an int in [0, 2**32), not a bool: {value!r}")
        try:
            value = operator.index(value)
        except TypeError:
            raise ValueError(f"{field} must be an int in [0, 2**32), got {value!r}") from None
    if not 0 <= value < TOKEN_ID_LIMIT:
        raise ValueError(f"{field} must be an int in [0, 2**32), got {value!r}")
    return value


def as_token_id_list(ids: Iterable[Any], field: str) -> list[int]:
    """A checked list of plain ``int`` token ids (``ValueError`` for a non-iterable)."""
    if isinstance(ids, str | bytes):
        raise ValueError(f"{field} must be a list of token ids, got {type(ids).__name__}")
    try:
        items = list(ids)
    except TypeError:
        raise ValueError(f"{field} must be a list of token ids, got {ids!r}") from None
    return pack_token_ids(items, field).tolist()
