"""The Triton attention kernel's launch choices: pure rules, one function per choice.

Measured on an NVIDIA H200 on 2026-11-26 (``research/tune_attention.py``;
``benchmarks/results/attention-tuning-nvidia-h200.md``), bf16, 32 query / 8 KV
heads, head 128, block 16:

    batch                   block_m  tile_n  warps  stages  split-KV segments
    ----------------------  -------  ------  -----  ------  -----------------------
    prefill only                128      32      4       3  1
    prefill + decodes            64      32      4       3  1
    decodes, span > 1024         16     128      4       3  span // 2048, <= 16
    decodes, span <= 1024        16      32      2       3  1 (span // 2048 = 0)

``span``: the keys a decode can see, the longest sequence cut to the sliding
window or attention chunk. Speedups over the rules before the sweep, where
these rules give a shape exactly the sweep's best choice (3 stages is what
Triton uses when none is given, so "default stages" in the sweep is 3):

- prefill 4 x 2k: 1.94x; mixed 2k chunk + 64 x 8k decodes: 1.62x (block_m 64:
  a decode's program holds ``block_m / G`` rows of one token, so smaller
  blocks idle less); decode 64 x 32k: 1.26x (16 segments although 512
  programs already exceeded 2 per SM); decode 256 x 2k: 1.07x; sliding window
  1024, decode 64 x 32k: 1.64x (the gain is the tile and warps: the old split
  already followed the window and gave 1 segment).

Close to the sweep's best but not that exact choice (untested as chosen):
prefill 1 x 8k (best 1.91x with 4 stages, by a margin the sweep did not
record over 3); decode 1 x 32k (best 1.25x with 4 stages); decode 16 x 8k
(best 1.09x with tile_n 64, 2 stages and 3 segments; the rules give tile_n
128, 3 stages, 4 segments).

Not measured anywhere (to measure next): spans between 1025 and 2047 keys;
decodes of under 128 programs (batch 1-15 at head 128 with 8 KV heads, Gemma 3 270M's
64 sequences x 1 KV head): the fill rule below splits them; head sizes below 128 (they
take the head-128 rules); fp32 (decode tiles of 64 keys, so that a K/V tile keeps
bf16's 32 KiB at head 128).
Head sizes above 128 keep the rules from before the sweep, never timed:
block_m at most 64, tile_n 32 (the fp32 accumulator and K/V tiles of head 256
would spill registers), 8 warps for tiles of at least 64 x 128 (rows x padded
head), else 4; their split follows the span and the fill rule like the others.

**Filling the GPU (2026-11-28, a model, not yet timed):** a decode launch whose
programs (sequences x KV heads) fill under ``PROGRAMS_PER_SM`` per SM also splits, into
as many segments as keep it within that many programs per SM, each of at least
``MIN_SEGMENT_TILES`` key tiles; the larger of this and the span's split wins. Why
(``research/decode_attention_bytes.py``, ``benchmarks/results/decode-attention-bytes.md``):
a program walks its key tiles latency-bound, about 2-3 us a tile whatever the tile's
bytes (H100 graphed decodes of 1-16 sequences; Gemma 3 270M's graphed step on an H200:
64 programs of ~10 tiles, 29 us a layer, 7.7x its bytes), so a launch of fewer programs
than the GPU holds runs at programs x one program's rate. None of the sweep's shapes
changes (each already has 128 programs or more, or 16 segments).

Split-KV runs only on CUDA (the interpreter runs programs one after another,
so a split only adds work; ``sms`` is 0 there) and only for decode-only batches.
``TritonTiles`` (``tiles.py``) overrides any choice for one call.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from hybridkv.kernels.attention.tiles import TritonTiles

MAX_SEGMENTS = 16
#: Automatic split-KV: one segment per this many visible keys (H200 sweep).
SEGMENT_KEYS = 2048
#: A decode launch splits until it has about this many programs per SM: the
#: Gemma 3 270M decode kernel (head 256, 4 warps) compiles to 196 registers a thread
#: for sm_90, so two programs fit an SM (``research/kernel_resources.py``).
PROGRAMS_PER_SM = 2
#: ...in segments of at least this many key tiles: by the model's ~5 us for the merge
#: launch against ~2.5 us a tile, a shorter segment saves less than the merge costs.
MIN_SEGMENT_TILES = 2
#: Decodes that see at most this many keys take the short-span tiles (H200 sweep).
SHORT_SPAN = 1024
#: Head sizes above this keep the pre-sweep, register-safe tiles.
MEASURED_HEAD = 128
MAX_HEAD_SIZE = 256
NUM_STAGES = 3


class BatchKind(enum.Enum):
    """What a step's varlen batch holds, as far as the launch choices care."""

    DECODE = "decode-only"
    PREFILL = "prefill-only"
    MIXED = "prefill + decodes"

    @classmethod
    def of(cls, max_query_len: int, min_query_len: int) -> BatchKind:
        if max_query_len <= 1:
            return cls.DECODE
        return cls.MIXED if min_query_len == 1 else cls.PREFILL


@dataclass(frozen=True, slots=True)
class LaunchChoice:
    """One launch's choices (module docstring); ``block_q = block_m // G`` tokens."""

    block_m: int
    block_q: int
    tile_n: int
    num_warps: int
    num_stages: int
    segments: int
    #: Dispatch order: q blocks last first, KV heads inner (``TritonTiles.longest_first``).
    longest_first: bool = False


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= ``n`` (>= 1); plain Python, unlike Triton's
    ``constexpr_function`` of the same name, which costs microseconds per call."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def head_pad(head_size: int) -> int:
    return max(16, next_power_of_2(head_size))


def choose_blocks(
    kind: BatchKind, num_queries_per_kv: int, head_size: int, block_m: int | None = None
) -> tuple[int, int]:
    """``(BLOCK_M, BLOCK_Q)``; ``block_m`` overrides the rule (``TritonTiles``) and
    must hold one token's query heads (at least 16 for ``tl.dot``)."""
    least = max(16, next_power_of_2(num_queries_per_kv))
    if block_m is None:
        rule = {BatchKind.DECODE: 16, BatchKind.MIXED: 64, BatchKind.PREFILL: 128}[kind]
        if head_size > MEASURED_HEAD:
            rule = min(rule, 64)
        block_m = max(rule, least)
    elif block_m < least:
        raise ValueError(
            f"tiles.block_m={block_m}: a program's rows must hold the {num_queries_per_kv} "
            f"query heads of one KV head (at least {least})"
        )
    return block_m, block_m // num_queries_per_kv


def tile_n(kind: BatchKind, head_size: int, elem_size: int, span: int) -> int:
    """Keys per loop iteration."""
    if head_size > MEASURED_HEAD or kind is not BatchKind.DECODE or span <= SHORT_SPAN:
        return 32
    return 128 if elem_size <= 2 else 64


def num_warps(kind: BatchKind, head_size: int, block_m: int, span: int) -> int:
    if head_size > MEASURED_HEAD:
        return 8 if block_m * head_pad(head_size) >= 64 * 128 else 4
    return 2 if kind is BatchKind.DECODE and span <= SHORT_SPAN else 4


def auto_segments(
    kind: BatchKind,
    span: int,
    sms: int,
    programs: int,
    keys_per_tile: int,
    min_tiles: int | None = None,
) -> int:
    """Split-KV segments (1 = no split) of a launch of ``programs`` programs before the
    split (decodes: sequences x KV heads) on ``sms`` SMs (0: not CUDA, no split), each
    walking ``span`` keys in tiles of ``keys_per_tile``: the larger of the span's rule
    (one segment per ``SEGMENT_KEYS`` keys) and ``fill_segments``, at most
    ``MAX_SEGMENTS``; decode-only batches on CUDA only. ``min_tiles`` (``TritonTiles``)
    sets the shortest segment of both rules."""
    if not sms or kind is not BatchKind.DECODE:
        return 1
    seg_keys = SEGMENT_KEYS if min_tiles is None else min_tiles * keys_per_tile
    tiles = -(-span // keys_per_tile)
    fill = fill_segments(sms, programs, tiles, min_tiles or MIN_SEGMENT_TILES)
    return max(1, min(MAX_SEGMENTS, max(span // seg_keys, fill)))


def fill_segments(sms: int, programs: int, tiles: int, min_tiles: int = MIN_SEGMENT_TILES) -> int:
    """The most segments that keep ``programs x segments`` within ``PROGRAMS_PER_SM``
    per SM and each segment at least ``min_tiles`` of the ``tiles`` key tiles (>= 1)."""
    room = PROGRAMS_PER_SM * sms // max(1, programs)
    return max(1, min(room, tiles // min_tiles))


def choose_launch(
    kind: BatchKind,
    span: int,
    num_queries_per_kv: int,
    head_size: int,
    elem_size: int,
    sms: int,
    programs: int,
    tiles: TritonTiles | None = None,
    num_segments: int | None = None,
) -> LaunchChoice:
    """Every choice for one launch: the rules, with ``tiles`` and ``num_segments`` on top.
    ``sms``: the device's SMs (0 off CUDA); ``programs``: the launch's programs before a
    split (``auto_segments``)."""
    t = tiles or TritonTiles()
    block_m, block_q = choose_blocks(kind, num_queries_per_kv, head_size, t.block_m)
    keys = t.tile_n or tile_n(kind, head_size, elem_size, span)
    segments = num_segments or auto_segments(
        kind, span, sms, programs, keys, t.min_tiles_per_segment
    )
    return LaunchChoice(
        block_m=block_m,
        block_q=block_q,
        tile_n=keys,
        num_warps=t.num_warps or num_warps(kind, head_size, block_m, span),
        num_stages=t.num_stages or NUM_STAGES,
        segments=segments,
        longest_first=bool(t.longest_first),
    )
