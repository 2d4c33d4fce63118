"""Hypothesis profiles, picked with the ``HYPOTHESIS_PROFILE`` environment variable.

- ``ci`` (default): 200 examples of up to 40 steps each, what ``make test`` runs;
- ``dev``: 50 examples, for quick local iterations;
- ``thorough``: 10,000 examples (``HYPOTHESIS_PROFILE=thorough make test``);
- ``mutation``: ``ci`` without shrinking or example database (``make mutation``).

Without CUDA, Triton kernels run in Triton's CPU interpreter: ``TRITON_INTERPRET``
must be set before any ``@triton.jit`` decorator runs, so it is set here, before
any test module imports ``hybridkv.kernels``. With CUDA (and the interpreter not
asked for), the same ``backend="triton"`` cases run compiled on the GPU
(``tests/triton_on_cuda.py``); a test of the CPU-only refusal asks for the
``native_triton_checks`` fixture.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

# Under pytest-xdist (``make test``: one worker per core) each worker computes on one
# thread: torch's and the native kernels' OpenMP threads would otherwise oversubscribe
# the cores, and OpenMP's spinning threads then cost several times the work. Set before
# torch loads OpenMP; an explicit OMP_NUM_THREADS (the GPU session's) wins.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings

from hybridkv.tiers.store_master import MooncakeMaster

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

_SHIM = None
# HYBRIDKV_TEST_SHIM_DEVICE=cpu runs the shim's copies on the CPU, under the
# interpreter: a check of the shim itself on a machine without a GPU.
_shim_device = os.environ.get("HYBRIDKV_TEST_SHIM_DEVICE")
if _shim_device is None and torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    _shim_device = "cuda"
if _shim_device:
    from triton_on_cuda import install

    _SHIM = install(_shim_device)


@pytest.fixture
def native_triton_checks() -> Iterator[None]:
    """The kernels' own backend checks, as a user's process has them: without CUDA
    they are never changed; on a GPU machine the Triton-on-CUDA shim is off meanwhile."""
    if _SHIM is None:
        yield
        return
    with _SHIM.native():
        yield


for _name, _examples in (("ci", 200), ("dev", 50), ("thorough", 10_000)):
    settings.register_profile(
        _name,
        max_examples=_examples,
        stateful_step_count=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )

# Mutation runs (``make mutation``): a failure is all that counts, so no shrinking and no
# example database (a mutant's failure must not leak into the next run).
settings.register_profile(
    "mutation",
    settings.get_profile("ci"),
    phases=[Phase.explicit, Phase.generate, Phase.target],
    database=None,
)

settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="module")
def mooncake_master() -> Iterator[MooncakeMaster]:
    """A ``mooncake_master`` on free loopback ports for one test module, stopped after it
    (``hybridkv.tiers.store_master``; the ``store`` extra, which ``make dev`` installs)."""
    with MooncakeMaster(lease_ms=300) as master:
        yield master


@pytest.fixture
def fresh_mooncake_master() -> Iterator[MooncakeMaster]:
    """A master of the test's own, for tests that kill and restart it."""
    with MooncakeMaster(lease_ms=300) as master:
        yield master
