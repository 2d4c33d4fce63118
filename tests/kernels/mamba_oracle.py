"""Naive fp64 oracles and strided state views for the Mamba kernel tests.

The oracles walk one sequence token by token in Python (fp64), the way the
math is written in mamba-ssm's docstrings; the varlen drivers apply them per
sequence and return the expected outputs and the expected content of every
slot a call writes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

F64 = torch.float64


# ---------------------------------------------------------------- state views


@dataclass
class StateViews:
    """A raw byte buffer holding one Mamba layer's conv and SSM views per slot."""

    raw: torch.Tensor  # [num_slots * slot_bytes] uint8
    conv: torch.Tensor  # [num_slots, *conv_shape], slot stride != prod(conv_shape)
    ssm: torch.Tensor  # [num_slots, *ssm_shape]


def _strides(shape: tuple[int, ...]) -> list[int]:
    out = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        out[i] = out[i + 1] * shape[i + 1]
    return out


def state_views(
    num_slots: int,
    conv_shape: tuple[int, ...],
    ssm_shape: tuple[int, ...],
    conv_dtype: torch.dtype = torch.float32,
    ssm_dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> StateViews:
    """Views laid out like ``allocate_kv_cache``'s, behind another layer's page.

    A slot is [other layer: 48 bytes][conv][pad to ssm alignment][ssm][tail: 40 bytes];
    the bytes outside the views are random, the views hold finite random values.
    """
    g = torch.Generator().manual_seed(seed)
    ce = torch.empty((), dtype=conv_dtype).element_size()
    se = torch.empty((), dtype=ssm_dtype).element_size()
    conv_off = 48
    conv_bytes = ce * int(torch.tensor(conv_shape).prod())
    ssm_off = -(-(conv_off + conv_bytes) // se) * se
    slot = ssm_off + se * int(torch.tensor(ssm_shape).prod()) + 40
    slot = -(-slot // 8) * 8
    raw = torch.randint(0, 256, (num_slots * slot,), dtype=torch.uint8, generator=g)
    conv = raw.view(conv_dtype).as_strided(
        (num_slots, *conv_shape), (slot // ce, *_strides(conv_shape)), conv_off // ce
    )
    ssm = raw.view(ssm_dtype).as_strided(
        (num_slots, *ssm_shape), (slot // se, *_strides(ssm_shape)), ssm_off // se
    )
    conv.copy_(torch.randn(conv.shape, generator=g))
    ssm.copy_(torch.randn(ssm.shape, generator=g) * 0.5)
    return StateViews(raw, conv, ssm)


def clone_views(v: StateViews) -> StateViews:
    raw = v.raw.clone()
    conv = raw.view(v.conv.dtype).as_strided(v.conv.shape, v.conv.stride(), v.conv.storage_offset())
    ssm = raw.view(v.ssm.dtype).as_strided(v.ssm.shape, v.ssm.stride(), v.ssm.storage_offset())
    return StateViews(raw, conv, ssm)


def assert_only_slots_changed(
    before: StateViews, after: StateViews, view: str, slots: set[int]
) -> None:
    """Every byte of the buffer except ``view``'s rows of ``slots`` is unchanged."""
    expect = clone_views(before)
    getattr(expect, view)[sorted(slots)] = getattr(after, view)[sorted(slots)]
    assert torch.equal(expect.raw, after.raw), "bytes outside the written slots changed"


# ---------------------------------------------------------------- per-sequence oracles


def conv_oracle(
    x: torch.Tensor,  # [L, dim]
    weight: torch.Tensor,  # [dim, W]
    bias: torch.Tensor | None,
    activation: str | None,
    init: torch.Tensor | None,  # [W-1, dim]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [L, dim], states [L, W-1, dim])``: output and conv state after each token."""
    w = weight.to(F64)
    width = w.shape[1]
    start = init if init is not None else torch.zeros(width - 1, x.shape[1])
    hist = list(start.to(F64))
    outs, states = [], []
    for xt in x.to(F64):
        window = [*hist[len(hist) - (width - 1) :], xt]
        y = sum(window[k] * w[:, k] for k in range(width))
        if bias is not None:
            y = y + bias.to(F64)
        if activation == "silu":
            y = F.silu(y)
        outs.append(y)
        hist.append(xt)
        states.append(torch.stack(hist[len(hist) - (width - 1) :]))
    return _stack(outs, (x.shape[1],)), _stack(states, (width - 1, x.shape[1]))


def _stack(rows: list[torch.Tensor], shape: tuple[int, ...]) -> torch.Tensor:
    return torch.stack(rows) if rows else torch.zeros((0, *shape), dtype=F64)


def _dt(dt: torch.Tensor, dt_bias: torch.Tensor | None, softplus: bool) -> torch.Tensor:
    dt = dt.to(F64)
    if dt_bias is not None:
        dt = dt + dt_bias.to(F64)
    return torch.log1p(torch.exp(dt)) if softplus else dt


def mamba1_oracle(
    x: torch.Tensor,  # [L, d]
    dt: torch.Tensor,  # [L, d]
    A: torch.Tensor,  # [d, n]
    B: torch.Tensor,  # [L, n]
    C: torch.Tensor,  # [L, n]
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    softplus: bool,
    h0: torch.Tensor | None,  # [d, n]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y [L, d], states [L, d, n])`` of a Mamba1 selective scan."""
    d, n = A.shape
    h = h0.to(F64) if h0 is not None else torch.zeros(d, n, dtype=F64)
    ys, states = [], []
    for t in range(x.shape[0]):
        dtt = _dt(dt[t], dt_bias, softplus)
        xt = x[t].to(F64)
        h = h * torch.exp(dtt[:, None] * A.to(F64)) + (dtt * xt)[:, None] * B[t].to(F64)
        y = h @ C[t].to(F64)
        if D is not None:
            y = y + D.to(F64) * xt
        if z is not None:
            y = y * F.silu(z[t].to(F64))
        ys.append(y)
        states.append(h)
    return _stack(ys, (d,)), _stack(states, (d, n))


def mamba2_oracle(
    x: torch.Tensor,  # [L, H, P]
    dt: torch.Tensor,  # [L, H]
    A: torch.Tensor,  # [H]
    B: torch.Tensor,  # [L, G, N]
    C: torch.Tensor,  # [L, G, N]
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    softplus: bool,
    h0: torch.Tensor | None,  # [H, P, N]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y [L, H, P], states [L, H, P, N])`` of a Mamba2 SSD scan, head by head."""
    _, H, P = x.shape
    G, N = B.shape[1], B.shape[2]
    st = h0.to(F64).clone() if h0 is not None else torch.zeros(H, P, N, dtype=F64)
    ys, states = [], []
    for t in range(x.shape[0]):
        dtt = _dt(dt[t], dt_bias, softplus)
        y = torch.zeros(H, P, dtype=F64)
        new = torch.empty_like(st)
        for h in range(H):
            g = h // (H // G)
            xh = x[t, h].to(F64)
            new[h] = st[h] * torch.exp(dtt[h] * A[h].to(F64)) + dtt[h] * xh[:, None] * B[t, g].to(
                F64
            )
            y[h] = new[h] @ C[t, g].to(F64)
            if D is not None:
                y[h] += D[h].to(F64) * xh
            if z is not None:
                y[h] *= F.silu(z[t, h].to(F64))
        st = new
        ys.append(y)
        states.append(st)
    return _stack(ys, (H, P)), _stack(states, (H, P, N))


# ---------------------------------------------------------------- varlen driver


def varlen_oracle(
    run_seq,  # (token slice, initial state or None) -> (out [L, ...], states [L, ...])
    state: torch.Tensor,  # [num_slots, ...] view before the call
    qsl: list[int],
    init_idx: list[int],
    save_idx: list[int],
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """Expected ``out [T, ...]`` and ``{slot: state}`` for every save."""
    outs, saves = [], {}
    for s in range(len(qsl) - 1):
        a, b = qsl[s], qsl[s + 1]
        init = state[init_idx[s]].clone() if init_idx[s] >= 0 else None
        out, states = run_seq(slice(a, b), init)
        outs.append(out)
        for t in range(a, b):
            if save_idx[t] >= 0:
                saves[save_idx[t]] = states[t - a]
    return torch.cat(outs), saves


def lengths_to_qsl(lengths: list[int]) -> list[int]:
    qsl = [0]
    for n in lengths:
        qsl.append(qsl[-1] + n)
    return qsl


@dataclass(frozen=True)
class Scenario:
    """A varlen prefill call: sequence lengths, initial slots, ``{token: save slot}``."""

    name: str
    lengths: tuple[int, ...]
    init: tuple[int, ...]
    saves: tuple[tuple[int, int], ...]

    @property
    def qsl(self) -> list[int]:
        return lengths_to_qsl(list(self.lengths))

    @property
    def save_idx(self) -> list[int]:
        out = [-1] * sum(self.lengths)
        for t, slot in self.saves:
            out[t] = slot
        return out

    @property
    def written(self) -> set[int]:
        return {slot for _, slot in self.saves}

    def tensors(self, index_dtype: torch.dtype = torch.int32) -> tuple[torch.Tensor, ...]:
        """``(query_start_loc, initial_state_indices, save_state_indices)``."""
        return (
            torch.tensor(self.qsl, dtype=index_dtype),
            torch.tensor(self.init, dtype=index_dtype),
            torch.tensor(self.save_idx, dtype=index_dtype),
        )


# 8 slots; slot 0 is the null block and is never named. Token ids are global.
SCENARIOS = [
    Scenario("one_seq_from_zeros", (5,), (-1,), ((4, 3),)),
    # seq 0 starts mid-block from slot 2 and checkpoints into slot 2 after its
    # first token (the initial == save case: later tokens still need the conv
    # history read from slot 2), then its final state into 3; seq 2 saves its
    # final state into its own initial slot 5 after an early save into 6.
    Scenario("mixed", (7, 1, 4), (2, -1, 5), ((0, 2), (6, 3), (7, 4), (8, 6), (11, 5))),
    # two sequences read the same cached slot; shorter than the conv window.
    Scenario("shared_init_short", (1, 2, 3), (1, 1, -1), ((0, 3), (1, 6), (2, 2), (5, 7))),
    # an empty sequence in the middle, odd lengths, saves at every other token.
    Scenario("empty_seq", (9, 0, 3), (4, 7, 6), ((1, 4), (3, 2), (8, 1), (10, 3), (11, 6))),
]

# For the chunked scans, with chunks of Q = 16 tokens; 16 slots, slot 0 never named.
CHUNK_SCENARIOS = [
    # Lengths 1, Q-1, Q, Q+1, 2.5 Q; saves at chunk ends, inside chunks, on a
    # first token, two in one chunk, into the sequence's own initial slot.
    Scenario(
        "chunk_edges",
        (1, 15, 16, 17, 40),
        (3, -1, 5, -1, 2),
        (
            (0, 3),  # a 1-token sequence saves into its own initial slot
            (5, 6),  # inside a chunk
            (15, 7),  # the last token of a Q-1 chunk
            (31, 5),  # the end of an exact chunk, into its own initial slot
            (47, 8),  # the end of chunk 0 of a Q+1 sequence
            (48, 9),  # its 1-token second chunk
            (49, 10),  # a sequence's first token
            (52, 11),  # two more in the same chunk
            (58, 12),
            (80, 13),  # the end of chunk 1
            (88, 2),  # the final state into the initial slot
        ),
    ),
    # A sequence resuming at absolute position 5 with blocks of 8 saves at local
    # 2, 10, 18 and its end (chunks do not align with blocks); a second one from zeros.
    Scenario(
        "resume_mid_block",
        (21, 9),
        (1, -1),
        ((2, 2), (10, 3), (18, 4), (20, 5), (28, 6), (29, 7)),
    ),
]
