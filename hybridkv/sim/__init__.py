"""Trace replay: the engine's scheduler and KV cache manager on a modeled device.

``hybridkv simulate`` (``hybridkv.sim.command``) reads a request trace
(``trace``), plans the KV memory of a layout, and replays the requests
through the real ``Scheduler`` and ``KVCacheManager`` (``replay``) with step
times from a roofline cost model (``cost_model``, ``devices``,
``model_params``). Each replay gives a ``SimResult``.
"""

from hybridkv.sim.cost_model import CostModel, StepCost
from hybridkv.sim.devices import DEVICES, DeviceProfile, device_profile
from hybridkv.sim.model_params import ACTIVE_PARAMS, active_params_for
from hybridkv.sim.options import ARRIVALS, SimOptions
from hybridkv.sim.replay import replay_trace
from hybridkv.sim.result import SimResult
from hybridkv.sim.trace import TraceError, TraceRequest, load_trace

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
