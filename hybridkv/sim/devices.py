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

Copy links of the tiers below the device pool (``hybridkv simulate
--host-memory/--disk``), as achievable bytes/s (no efficiency applied):

- host -> device: pinned host memory over PCIe. H100 and H200 SXM sit on PCIe
  Gen5 x16 (64 GB/s per direction); a pinned ``cudaMemcpyAsync`` of large
  buffers reaches about 55 GB/s there (typical published bandwidthTest /
  nvbandwidth figures, 50-57 GB/s). A100 SXM4 sits on PCIe Gen4 x16 (32 GB/s):
  about 25 GB/s pinned (typical published figures, 24-26 GB/s).
- disk -> host: one local PCIe Gen4 NVMe data drive, 7 GB/s sequential read
  (datasheets of Gen4 data-center drives: Samsung PM1733 7.0 GB/s, Kioxia CM6
  6.9 GB/s), the same for every profile.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Assumed achievable fractions of the peaks (see the module docstring).
COMPUTE_EFFICIENCY = 0.6
BANDWIDTH_EFFICIENCY = 0.8
STEP_OVERHEAD_S = 2e-3
#: Pinned host -> device copy over PCIe Gen5 x16 / Gen4 x16 (module docstring).
PCIE5_HOST_TO_DEVICE = 55e9
PCIE4_HOST_TO_DEVICE = 25e9
#: One local Gen4 NVMe drive's sequential read (module docstring).
NVME_DISK_TO_HOST = 7e9


@dataclass(frozen=True, slots=True)
class DeviceProfile:
    """Peak dense bf16 FLOP/s and HBM bytes/s, with the achievable fractions."""

    name: str
    peak_flops: float
    peak_bandwidth: float
    compute_efficiency: float = COMPUTE_EFFICIENCY
    bandwidth_efficiency: float = BANDWIDTH_EFFICIENCY
    step_overhead_s: float = STEP_OVERHEAD_S
    #: Achievable bytes/s of a load from host RAM into device memory.
    host_to_device_bandwidth: float = PCIE5_HOST_TO_DEVICE
    #: Achievable bytes/s of a read from the local disk into host RAM.
    disk_to_host_bandwidth: float = NVME_DISK_TO_HOST

    def __post_init__(self) -> None:
        for field in (
            "peak_flops",
            "peak_bandwidth",
            "compute_efficiency",
            "bandwidth_efficiency",
            "host_to_device_bandwidth",
            "disk_to_host_bandwidth",
        ):
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
    "a100": DeviceProfile(
        "a100",
        peak_flops=312e12,
        peak_bandwidth=2.0e12,
        host_to_device_bandwidth=PCIE4_HOST_TO_DEVICE,
    ),
}


def device_profile(name: str) -> DeviceProfile:
    """The profile called ``name``; ``ValueError`` listing the known ones otherwise."""
    profile = DEVICES.get(name.lower())
    if profile is None:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {name!r}")
    return profile
