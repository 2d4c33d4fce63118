"""Shared pieces of the Mamba ops: argument checks, backend choice, varlen bookkeeping,
the fp32 ``dt`` of the references and the call into mamba-ssm.

Conventions every op follows (see ``hybridkv/managers/mamba.py`` for which
slot holds which checkpoint):

- State lives in strided views of the shared KV buffer: ``[num_slots, ...]``
  whose slot stride is the buffer's slot size, not the product of the other
  dimensions. Only the last dimension must have stride 1; every op uses the
  real strides.
- Requests pick slots by index tensors (int32/int64). Slot 0 is the null block:
  it is touched only where an index names it.
- Decode ops: a negative index marks a padding row (output zero, no state read
  or written).
- Prefill ops: ``initial_state_indices[s] < 0`` starts sequence ``s`` from
  zeros; ``save_state_indices[t] >= 0`` names the slot that receives the state
  *after* token ``t``. All initial states are read before any save is written,
  so a sequence may save into the slot it started from. A slot written in one
  call must not be read or written by another sequence of the same call, and
  no two tokens may save into the same slot.
- Slot values are not range-checked (that would cost a device sync): the torch
  path raises ``IndexError`` on an out-of-range slot, a Triton kernel would
  read or write out of bounds. Two decode rows must not name the same slot.
- Math runs in fp32; states are stored in their view's dtype, outputs in the
  activations' dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridkv.kernels.backend import (
    resolve_backend,
)
from hybridkv.kernels.checks import CACHE_DTYPES, INDEX_DTYPES, check_tensor
from hybridkv.kernels.mamba.args import ConvArgs, SSMInputs, SSMStepArgs

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
ACTIVATIONS = (None, "silu")


def check_float(
    name: str, t: torch.Tensor, shape: tuple[int | None, ...], device: torch.device
) -> None:
    """A float activation/parameter tensor with a unit last stride."""
    check_tensor(name, t, shape=shape, dtypes=FLOAT_DTYPES, device=device, unit_last_stride=True)


def check_optional_float(
    name: str, t: torch.Tensor | None, shape: tuple[int | None, ...], device: torch.device
) -> None:
    if t is not None:
        check_float(name, t, shape, device)


def check_state(
    name: str, state: torch.Tensor, tail: tuple[int, ...], device: torch.device
) -> None:
    """A state view ``[num_slots, *tail]`` (any slot stride, unit last stride)."""
    check_tensor(
        name, state, shape=(None, *tail), dtypes=CACHE_DTYPES, device=device, unit_last_stride=True
    )
    if state.shape[0] < 1:
        raise ValueError(f"{name}: needs at least one slot, got shape {tuple(state.shape)}")


def check_indices(name: str, idx: torch.Tensor, n: int, device: torch.device) -> None:
    check_tensor(name, idx, shape=(n,), dtypes=INDEX_DTYPES, device=device, contiguous=True)


def check_activation(activation: str | None) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: {activation!r} is not one of {ACTIVATIONS}")


def check_query_start_loc(qsl: torch.Tensor, device: torch.device) -> int:
    """Shape/dtype of ``query_start_loc [S+1]``; returns ``S``."""
    check_tensor("query_start_loc", qsl, ndim=1, dtypes=INDEX_DTYPES, device=device)
    if qsl.shape[0] < 2 or not qsl.is_contiguous():
        raise ValueError(
            f"query_start_loc: expected a contiguous [num_seqs + 1] tensor with at least 2 "
            f"entries, got shape {tuple(qsl.shape)}"
        )
    return qsl.shape[0] - 1


def check_ssm_optionals(
    a: SSMInputs, per_channel: tuple[int, ...], z_shape: tuple[int, ...]
) -> None:
    """``D`` and ``dt_bias`` (``per_channel``) and the gate ``z`` (``z_shape``), where given."""
    check_optional_float("D", a.D, per_channel, a.x.device)
    check_optional_float("z", a.z, z_shape, a.x.device)
    check_optional_float("dt_bias", a.dt_bias, per_channel, a.x.device)


def check_groups(B: torch.Tensor, lead: int, n_heads: int, device: torch.device) -> tuple[int, int]:
    """Mamba2's ``B [lead, n_groups, d_state]`` with ``n_groups | n_heads``; returns both sizes."""
    check_float("B", B, (lead, None, None), device)
    n_groups, d_state = B.shape[1], B.shape[2]
    if n_groups == 0 or n_heads % n_groups:
        raise ValueError(f"B: n_groups={n_groups} must divide n_heads={n_heads}")
    return n_groups, d_state


def check_varlen(
    qsl: torch.Tensor, init: torch.Tensor, save: torch.Tensor, num_tokens: int, device: torch.device
) -> None:
    """A prefill op's ``query_start_loc``, ``initial_state_indices`` and ``save_state_indices``."""
    num_seqs = check_query_start_loc(qsl, device)
    check_indices("initial_state_indices", init, num_seqs, device)
    check_indices("save_state_indices", save, num_tokens, device)


def check_conv(a: ConvArgs) -> int:
    """``x [n, dim]``, ``weight [dim, W]`` (W >= 2), ``bias``, ``activation``, ``conv_state``.

    Returns ``n`` (requests or tokens).
    """
    dev = a.x.device
    check_float("x", a.x, (None, None), dev)
    n, dim = a.x.shape
    check_float("weight", a.weight, (dim, None), dev)
    width = a.weight.shape[1]
    if width < 2:
        raise ValueError(f"weight: the conv width (dimension 1) must be >= 2, got {width}")
    check_optional_float("bias", a.bias, (dim,), dev)
    check_activation(a.activation)
    check_state("conv_state", a.conv_state, (width - 1, dim), dev)
    return n


def pick_backend(backend: str | None, device: torch.device, offered: tuple[str, ...]) -> str:
    """``resolve_backend`` for a Mamba op that ``offered`` (its ``Implementations.names``)."""
    return resolve_backend(backend, device, allowed=offered)


def mamba_ssm_step(
    a: SSMStepArgs,
    dt: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
) -> torch.Tensor:
    """mamba-ssm's ``selective_state_update`` on ``a`` with ``dt, A, D, dt_bias`` in its layout.

    mamba-ssm's launcher unpacks D's and dt_bias's strides even when they are
    None, so callers pass zeros for absent ones.
    """
    from hybridkv.kernels.mamba.mamba_ssm_compat import load_mamba_ssm

    out: torch.Tensor = load_mamba_ssm().selective_state_update(
        a.state, a.x, dt, A, a.B, a.C, D=D, z=a.z, dt_bias=dt_bias, dt_softplus=a.dt_softplus,
        state_batch_indices=a.state_indices,
    )  # fmt: skip
    return out


def softplus_where(dt: torch.Tensor) -> torch.Tensor:
    """Softplus with mamba-ssm's threshold (identity above 20)."""
    return torch.nn.functional.softplus(dt, threshold=20.0)


def effective_dt(dt: torch.Tensor, dt_bias: torch.Tensor | None, dt_softplus: bool) -> torch.Tensor:
    """fp32 ``softplus(dt + dt_bias)`` (each part where given), as the kernels compute it."""
    out = dt.float()
    if dt_bias is not None:
        out = out + dt_bias.float()
    if dt_softplus:
        out = softplus_where(out)
    return out


def skip_and_gate(
    y: torch.Tensor, x: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None
) -> torch.Tensor:
    """The references' output epilogue in fp32: ``y + D * x`` (``D`` over the
    leading feature dimension of ``x``'s rows: ``[H]`` for ``[.., H, P]``, ``[d]``
    for ``[.., d]``), then ``* silu(z)``; either step skipped where it is None."""
    if D is not None:
        y = y + D.float().reshape(*D.shape, *([1] * (x.dim() - 1 - D.dim()))) * x
    if z is not None:
        y = y * torch.nn.functional.silu(z.float())
    return y


def gather_initial(state: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """fp32 copies of ``state[idx[s]]`` (zeros where ``idx[s] < 0``): ``[S, *tail]``."""
    idx = idx.long()
    out = torch.zeros((idx.shape[0], *state.shape[1:]), dtype=torch.float32, device=state.device)
    valid = idx >= 0
    if bool(valid.any()):
        out[valid] = state[idx[valid]].float()
    return out


@dataclass(frozen=True)
class Varlen:
    """Token bookkeeping of a varlen batch (torch references only; syncs once)."""

    seq: torch.Tensor  # [T] int64: the sequence of each token
    pos: torch.Tensor  # [T] int64: position inside its sequence
    num_seqs: int
    max_len: int
    save_tokens: torch.Tensor  # [n] int64: tokens whose state is saved
    save_slots: torch.Tensor  # [n] int64: where


def varlen(qsl: torch.Tensor, save_state_indices: torch.Tensor, num_tokens: int) -> Varlen:
    """Map tokens to (sequence, position); raises ``ValueError`` on a bad ``query_start_loc``."""
    qsl = qsl.long()
    lengths = qsl[1:] - qsl[:-1]
    if int(qsl[0]) != 0 or int(qsl[-1]) != num_tokens or bool((lengths < 0).any()):
        raise ValueError(
            f"query_start_loc: must rise from 0 to the token count {num_tokens}, got {qsl.tolist()}"
        )
    tok = torch.arange(num_tokens, device=qsl.device)
    seq = torch.searchsorted(qsl[1:], tok, right=True)
    pos = tok - qsl[seq]
    save = save_state_indices.long()
    save_tokens = torch.nonzero(save >= 0).flatten()
    max_len = int(lengths.max()) if lengths.numel() else 0
    return Varlen(seq, pos, qsl.shape[0] - 1, max_len, save_tokens, save[save_tokens])


def pad(t: torch.Tensor, v: Varlen) -> torch.Tensor:
    """``[T, ...]`` -> ``[S, max_len, ...]`` (fp32, zero padded)."""
    out = t.new_zeros((v.num_seqs, v.max_len, *t.shape[1:]), dtype=torch.float32)
    out[v.seq, v.pos] = t.float()
    return out


def save_steps(v: Varlen) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Per position ``l``: (sequences saving after their token ``l``, rows in the save list)."""
    steps: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    if v.save_tokens.numel() == 0:
        return steps
    pos = v.pos[v.save_tokens]
    order = torch.argsort(pos, stable=True)
    sorted_pos = pos[order]
    uniq, counts = torch.unique_consecutive(sorted_pos, return_counts=True)
    start = 0
    for p, c in zip(uniq.tolist(), counts.tolist(), strict=True):
        rows = order[start : start + c]
        steps[p] = (v.seq[v.save_tokens[rows]], rows)
        start += c
    return steps


def check_chunk_size(chunk_size: int, least: int, why: str) -> None:
    """A chunked scan's chunk: a power of two >= ``least`` (``why`` says why)."""
    if not isinstance(chunk_size, int) or chunk_size < least or chunk_size & (chunk_size - 1):
        raise ValueError(
            f"chunk_size: must be a power of two >= {least} ({why}), got {chunk_size!r}"
        )


def chunk_layout(qsl: torch.Tensor, num_tokens: int, q: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunks of ``q`` tokens per sequence, computed on ``qsl``'s device without a sync.

    Returns ``bounds [2, num_chunks]`` (int64 first and end token of chunk
    ``c``; ``(0, 0)`` for the unused tail of the bound) and ``first [S + 1]``
    (int64: sequence ``s`` owns chunks ``first[s]:first[s+1]``), where
    ``num_chunks = (T + S (q - 1)) // q`` bounds ``sum_s ceil(len_s / q)``.
    """
    num_seqs = qsl.shape[0] - 1
    starts = qsl.long()
    per_seq = (starts[1:] - starts[:-1] + q - 1) // q
    first = torch.zeros(num_seqs + 1, dtype=torch.int64, device=qsl.device)
    torch.cumsum(per_seq, 0, out=first[1:])
    num_chunks = (num_tokens + num_seqs * (q - 1)) // q
    c = torch.arange(num_chunks, dtype=torch.int64, device=qsl.device)
    seq = torch.searchsorted(first[1:], c, right=True).clamp_(max=num_seqs - 1)
    begin = starts[seq] + (c - first[seq]) * q
    end = torch.minimum(begin + q, starts[seq + 1])
    used = c < first[-1]
    bounds = torch.stack([torch.where(used, begin, 0), torch.where(used, end, 0)])
    return bounds.contiguous(), first
