"""Frozen argument bundles of the Mamba ops.

Each public op takes its arguments flat (the mamba-ssm / vLLM signatures),
builds one of these once, and hands it to its ``_check``, ``_launch``,
``_reference`` and ``_mamba_ssm`` helpers. Shapes are documented on the public
functions; these classes only hold the tensors and never copy or check them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class SSMInputs:
    """What a Mamba1 or Mamba2 SSM step or scan reads besides states and indices."""

    x: torch.Tensor
    dt: torch.Tensor
    A: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    D: torch.Tensor | None
    z: torch.Tensor | None
    dt_bias: torch.Tensor | None
    dt_softplus: bool

    def optional_ptrs(self, dummy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(D, z, dt_bias)`` for a kernel launch: ``dummy`` (``x`` for ``z``) where absent."""
        return (
            self.D if self.D is not None else dummy,
            self.z if self.z is not None else self.x,
            self.dt_bias if self.dt_bias is not None else dummy,
        )

    def kernel_flags(self) -> dict[str, bool]:
        """The SSM kernels' ``DT_SOFTPLUS``/``HAS_D``/``HAS_Z``/``HAS_DT_BIAS`` constexprs."""
        return {
            "DT_SOFTPLUS": bool(self.dt_softplus),
            "HAS_D": self.D is not None,
            "HAS_Z": self.z is not None,
            "HAS_DT_BIAS": self.dt_bias is not None,
        }


@dataclass(frozen=True, slots=True)
class SSMStepArgs(SSMInputs):
    """``selective_state_update`` / ``ssd_state_update``: one decode step."""

    state: torch.Tensor
    state_indices: torch.Tensor


@dataclass(frozen=True, slots=True)
class ScanArgs(SSMInputs):
    """``selective_scan_fn`` / ``ssd_scan_fn``: a varlen prefill chunk."""

    ssm_state: torch.Tensor
    query_start_loc: torch.Tensor
    initial_state_indices: torch.Tensor
    save_state_indices: torch.Tensor


@dataclass(frozen=True, slots=True)
class ConvArgs:
    """What both conv ops read besides the slot indices."""

    x: torch.Tensor
    conv_state: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    activation: str | None


@dataclass(frozen=True, slots=True)
class ConvStepArgs(ConvArgs):
    """``causal_conv1d_update``: one decode step."""

    conv_state_indices: torch.Tensor


@dataclass(frozen=True, slots=True)
class ConvPrefillArgs(ConvArgs):
    """``causal_conv1d_fn``: a varlen prefill chunk."""

    query_start_loc: torch.Tensor
    initial_state_indices: torch.Tensor
    save_state_indices: torch.Tensor
