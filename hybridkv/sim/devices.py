"""Accelerator profiles for the step-time model: peak compute and memory bandwidth.

Peak figures are the vendors' datasheet numbers for dense bf16 tensor-core
math (no 2:4 sparsity) and HBM bandwidth:

- H100 SXM5 80GB: 989 TFLOP/s bf16 dense (1,979 with sparsity), 3.35 TB/s HBM3
  (NVIDIA H100 Tensor Core GPU datasheet);
- H200 SXM 141GB: the H100's compute, 4.8 TB/s HBM3e (NVIDIA H200 datasheet);
- A100 SXM4 80GB: 312 TFLOP/s bf16 dense (624 with sparsity), 2.0 TB/s HBM2e
  (NVIDIA A100 datasheet: 2,039 GB/s).

Nobody reaches the peaks. The achievable fractions are assumptions stated
here, the same for every device: large bf16 GEMMs run at about 60% of peak in
LLM serving (typical model-FLOPs utilisation of prefill), streaming reads at
about 80% of peak bandwidth. ``step_overhead_s`` (2 ms) stands for the
per-step work that is neither (scheduling, launches, sampling): a round,
assumed figure.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Assumed achievable fractions of the peaks (see the module docstring).
COMPUTE_EFFICIENCY = 0.6
BANDWIDTH_EFFICIENCY = 0.8
STEP_OVERHEAD_S = 2e-3


@dataclass(frozen=True, slots=True)
class DeviceProfile:
    """Peak dense bf16 FLOP/s and HBM bytes/s, with the achievable fractions."""

    name: str
    peak_flops: float
    peak_bandwidth: float
    compute_efficiency: float = COMPUTE_EFFICIENCY
    bandwidth_efficiency: float = BANDWIDTH_EFFICIENCY
    step_overhead_s: float = STEP_OVERHEAD_S

    def __post_init__(self) -> None:
        for field in ("peak_flops", "peak_bandwidth", "compute_efficiency", "bandwidth_efficiency"):
            if not getattr(self, field) > 0:
                raise ValueError(f"{field} must be > 0, got {getattr(self, field)!r}")
        for field in ("compute_efficiency", "bandwidth_efficiency"):
            if getattr(self, field) > 1:
                raise ValueError(f"{field} must be <= 1, got {getattr(self, field)!r}")
        if not self.step_overhead_s >= 0:
            raise ValueError(f"step_overhead_s must be >= 0, got {self.step_overhead_s!r}")

    @property
    def flops(self) -> float:
        """Achievable FLOP/s."""
        return self.peak_flops * self.compute_efficiency

    @property
    def bandwidth(self) -> float:
        """Achievable bytes/s."""
        return self.peak_bandwidth * self.bandwidth_efficiency


DEVICES: dict[str, DeviceProfile] = {
    "h100": DeviceProfile("h100", peak_flops=989e12, peak_bandwidth=3.35e12),
    "h200": DeviceProfile("h200", peak_flops=989e12, peak_bandwidth=4.8e12),
    "a100": DeviceProfile("a100", peak_flops=312e12, peak_bandwidth=2.0e12),
}


def device_profile(name: str) -> DeviceProfile:
    """The profile called ``name``; ``ValueError`` listing the known ones otherwise."""
    profile = DEVICES.get(name.lower())
    if profile is None:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {name!r}")
    return profile
