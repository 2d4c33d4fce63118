"""Trace replay: the engine's scheduler and KV cache manager on a modeled device.

``hybridkv simulate`` (``hybridkv.sim.command``) reads a request trace
(``trace``), plans the KV memory of a layout, and replays the requests
through the real ``Scheduler`` and ``KVCacheManager`` (``replay``) with step
times from a roofline cost model (``cost_model``, ``devices``,
``model_params``). Each replay gives a ``SimResult``.

Everything here needs only the core install (no torch, numpy or tqdm; checked
by ``tests/test_light_core.py`` and ``tests/test_bare_install.py``).
``replay_trace`` is imported on first use, for import weight only: it loads
the engine's scheduler and the layouts (pydantic), which ``hybridkv --help``,
registering ``simulate``, does not need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hybridkv.sim.cost_model import CostModel, StepCost
from hybridkv.sim.devices import DEVICES, DeviceProfile, device_profile
from hybridkv.sim.model_params import ACTIVE_PARAMS, active_params_for
from hybridkv.sim.options import ARRIVALS, SimOptions
from hybridkv.sim.result import SimResult
from hybridkv.sim.trace import TraceError, TraceRequest, load_trace

if TYPE_CHECKING:
    from hybridkv.sim.replay import replay_trace

__all__ = [
    "ACTIVE_PARAMS",
    "ARRIVALS",
    "DEVICES",
    "CostModel",
    "DeviceProfile",
    "SimOptions",
    "SimResult",
    "StepCost",
    "TraceError",
    "TraceRequest",
    "active_params_for",
    "device_profile",
    "load_trace",
    "replay_trace",
]


def __getattr__(name: str) -> Any:
    if name == "replay_trace":
        from hybridkv.sim.replay import replay_trace

        return replay_trace
    raise AttributeError(f"module 'hybridkv.sim' has no attribute {name!r}")
