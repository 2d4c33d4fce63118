"""A request as the KV cache manager sees it: token ids, cache keys, hashes.

The caller owns ``num_computed_tokens`` (tokens whose KV is written) and
appends sampled tokens with ``append_output_token_ids``. ``block_hashes``
holds one hash per full block and is kept up to date by the library: the first
manager that sees the request binds its block hasher to it, and from then on
every append hashes the blocks it fills. Callers never hash.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import overload

from hybridkv.core.hashing import BlockHash, BlockHasher, MMInput
from hybridkv.core.token_ids import TOKEN_ID_LIMIT, pack_token_ids, token_id


class TokenView(Sequence[int]):
    """A read-only view of a request's token list (no copy)."""

    __slots__ = ("_start", "_tokens")

    def __init__(self, tokens: list[int], start: int = 0) -> None:
        self._tokens = tokens
        self._start = start

    def __len__(self) -> int:
        return len(self._tokens) - self._start

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> list[int]: ...
    def __getitem__(self, i: int | slice) -> int | list[int]:
        if self._start == 0:
            return self._tokens[i]
        return self._tokens[self._start :][i]

    def __iter__(self) -> Iterator[int]:
        return iter(self._tokens[self._start :] if self._start else self._tokens)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenView):
            other = list(other)
        return list(self) == other if isinstance(other, (list, tuple)) else NotImplemented

    def __repr__(self) -> str:
        return f"TokenView({list(self)!r})"


def _check_mm_inputs(mm_inputs: Sequence[MMInput], num_prompt: int) -> tuple[MMInput, ...]:
    out = []
    for k, item in enumerate(mm_inputs):
        if not isinstance(item, (tuple, list)) or len(item) != 3:
            raise ValueError(f"mm_inputs[{k}] must be (content_hash, offset, length), got {item!r}")
        content_hash, offset, length = item
        if not isinstance(content_hash, (str, bytes)) or not content_hash:
            raise ValueError(f"mm_inputs[{k}].content_hash must be a non-empty str or bytes")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"mm_inputs[{k}].offset must be an int >= 0, got {offset!r}")
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"mm_inputs[{k}].length must be an int >= 1, got {length!r}")
        if offset + length > num_prompt:
            raise ValueError(
                f"mm_inputs[{k}] covers tokens [{offset}, {offset + length}) beyond the "
                f"{num_prompt}-token prompt"
            )
        out.append((content_hash, offset, length))
    return tuple(sorted(out, key=lambda t: t[1]))


class Request:
    """Token ids and cache keys of one request.

    ``mm_inputs`` lists multimodal placeholder ranges as
    ``(content_hash, offset, length)`` in prompt positions; blocks overlapping a
    range hash its content hash, so two images at the same positions never
    share KV. ``cache_salt`` isolates tenants: salted requests only hit blocks
    of the same salt. ``lora_name`` keys every block by the adapter.
    ``num_preemptions``: times the scheduler preempted it (a resumed request's
    prefix hit is its own earlier progress: ``hybrid`` learns branch points
    only from requests never preempted). ``returning``: set by a ``hybrid``
    manager when it first admits the request (``policy/returning.py``): its
    turn (>= 1) when its prompt continues one the cache has held, else 0; a
    resumed request keeps it.
    """

    __slots__ = (
        "_block_hashes",
        "_has_extra_keys",
        "_hasher",
        "_num_computed_tokens",
        "_prompt_bytes",
        "_token_ids",
        "cache_salt",
        "lora_name",
        "mm_inputs",
        "num_preemptions",
        "num_prompt_tokens",
        "request_id",
        "returning",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        *,
        cache_salt: str | None = None,
        lora_name: str | None = None,
        mm_inputs: Sequence[MMInput] | None = None,
    ) -> None:
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty str, got {request_id!r}")
        if isinstance(prompt_token_ids, str | bytes):
            raise ValueError("prompt_token_ids must be a list of token ids, not text")
        try:
            tokens = list(prompt_token_ids)
        except TypeError:
            raise ValueError(
                f"prompt_token_ids must be a list of token ids, got {prompt_token_ids!r}"
            ) from None
        packed = pack_token_ids(tokens, "prompt_token_ids").tobytes()
        if not tokens:
            raise ValueError("prompt_token_ids must hold at least one token")
        for name, value in (("cache_salt", cache_salt), ("lora_name", lora_name)):
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty str or None, got {value!r}")
        self.request_id = request_id
        self._token_ids = tokens
        # The prompt packed as uint32, reused by the hasher (avoids re-packing).
        self._prompt_bytes = packed
        self.num_prompt_tokens = len(tokens)
        self._num_computed_tokens = 0
        self.num_preemptions = 0
        self.returning: int | None = None
        self.cache_salt = cache_salt
        self.lora_name = lora_name
        self.mm_inputs = _check_mm_inputs(mm_inputs or (), len(tokens))
        self._has_extra_keys = bool(cache_salt or lora_name or self.mm_inputs)
        self._block_hashes: list[BlockHash] = []
        self._hasher: BlockHasher | None = None

    # -- tokens --------------------------------------------------------------
    @property
    def num_computed_tokens(self) -> int:
        """Tokens whose KV is written (the caller's to advance).

        Setting it checks ``0 <= value <= num_tokens`` (numpy ints accepted)
        and raises ``ValueError`` naming the field otherwise, leaving it as it was.
        """
        return self._num_computed_tokens

    @num_computed_tokens.setter
    def num_computed_tokens(self, value: int) -> None:
        if type(value) is not int or not 0 <= value <= len(self._token_ids):
            value = self._checked_num_computed(value)
        self._num_computed_tokens = value

    def _checked_num_computed(self, value: object) -> int:
        try:
            n = token_id(value, "num_computed_tokens")
        except ValueError:
            raise ValueError(
                f"request {self.request_id!r}: num_computed_tokens must be an int in "
                f"[0, num_tokens={self.num_tokens}], got {value!r}"
            ) from None
        if n > len(self._token_ids):
            raise ValueError(
                f"request {self.request_id!r}: num_computed_tokens={n} exceeds the "
                f"request's {self.num_tokens} tokens"
            )
        return n

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens."""
        return len(self._token_ids)

    @property
    def all_token_ids(self) -> TokenView:
        """Prompt then output token ids (read-only view)."""
        return TokenView(self._token_ids)

    @property
    def prompt_token_ids(self) -> list[int]:
        """A copy of the prompt token ids."""
        return self._token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> TokenView:
        """Output token ids (read-only view)."""
        return TokenView(self._token_ids, self.num_prompt_tokens)

    def append_output_token_ids(self, token_ids: int | Iterable[int]) -> None:
        """Append sampled tokens; blocks they fill are hashed at once.

        ``token_ids``: one id or an iterable of ids (``hybridkv.core.token_ids``
        rules, as for the prompt); anything else raises ``ValueError`` and
        appends nothing.
        """
        if type(token_ids) is int and 0 <= token_ids < TOKEN_ID_LIMIT:
            self._token_ids.append(token_ids)
        elif isinstance(token_ids, bool) or not hasattr(token_ids, "__iter__"):
            self._token_ids.append(token_id(token_ids, "token_ids"))
        else:
            if isinstance(token_ids, str | bytes):
                raise ValueError("token_ids must be an int or an iterable of ints, not text")
            try:
                ids = list(token_ids)
            except TypeError:
                raise ValueError(
                    f"token_ids must be an int or an iterable of ints, got {token_ids!r}"
                ) from None
            self._token_ids.extend(pack_token_ids(ids, "token_ids").tolist())
        hasher = self._hasher
        if hasher is not None and len(self._token_ids) // hasher.block_size > len(
            self._block_hashes
        ):
            self._hash_new_blocks(hasher)

    # -- hashes --------------------------------------------------------------
    @property
    def block_hashes(self) -> list[BlockHash]:
        """Hashes of the full blocks (empty until a caching manager sees it)."""
        if self._hasher is not None:
            self._hash_new_blocks(self._hasher)
        return list(self._block_hashes)

    @property
    def live_block_hashes(self) -> list[BlockHash]:
        """The hash list itself, not a copy: for the manager, which never mutates it.

        Up to date once a hasher is bound (``bind_hasher``): every append
        hashes the blocks it fills.
        """
        return self._block_hashes

    @property
    def packed_prompt(self) -> bytes:
        """The prompt's token ids packed as uint32 in native byte order (read-only)."""
        return self._prompt_bytes

    @property
    def live_token_ids(self) -> list[int]:
        """Prompt then output token ids, the list itself (read-only by contract)."""
        return self._token_ids

    def _hash_new_blocks(self, hasher: BlockHasher) -> None:
        keys = self if self._has_extra_keys else None
        hasher.extend(self._block_hashes, self._token_ids, self._prompt_bytes, keys)

    def bind_hasher(self, hasher: BlockHasher) -> None:
        """Attach the block hasher (done by the manager; idempotent)."""
        if self._hasher is hasher:
            return  # already bound: every append has kept the hashes up to date
        if self._hasher is not None and self._hasher.key != hasher.key:
            raise ValueError(
                f"request {self.request_id!r} is already hashed with {self._hasher.key} "
                f"(algo, seed, block size) and cannot be used with {hasher.key}"
            )
        self._hasher = hasher
        self._hash_new_blocks(hasher)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, num_tokens={self.num_tokens}, "
            f"num_computed_tokens={self.num_computed_tokens})"
        )
