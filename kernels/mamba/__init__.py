"""Mamba ops on state slots in the shared KV buffer.

Decode steps (one token per request, state updated in place)::

    causal_conv1d_update   depthwise causal conv, conv state [slots, W-1, conv_dim]
    selective_state_update Mamba1 SSM step, state [slots, d_inner, d_state]
    ssd_state_update       Mamba2 SSD step, state [slots, n_heads, head_dim, d_state]

Varlen prefill chunks (start from cached states, save block checkpoints)::

    causal_conv1d_fn       conv over the chunk
    selective_scan_fn      Mamba1 scan, sequential over tokens
    selective_chunk_scan_fn  the same scan, parallel within chunks of tokens
    ssd_scan_fn            Mamba2 scan, sequential over tokens
    ssd_chunk_scan_fn      the same scan in chunked SSD form (vLLM: mamba_chunk_scan_combined)

Each op takes ``backend=None | "triton" | "torch"`` (the decode SSM steps also
``"mamba_ssm"``, CUDA only); ``*_ref`` and ``*_triton`` are the checked torch
reference and Triton launcher with the same signature. See ``_common`` for
the slot/index conventions, ``args`` for the frozen argument bundles each op
builds once for its helpers, ``scan_tiles`` for ``ScanTiles`` (the chunked Mamba2
scan's launch choices, for tuning) and ``mamba_ssm_compat`` for optional mamba-ssm.
"""

from hybridkv.kernels.mamba.conv_prefill import (
    causal_conv1d_fn,
    causal_conv1d_fn_ref,
    causal_conv1d_fn_triton,
)
from hybridkv.kernels.mamba.conv_update import (
    causal_conv1d_update,
    causal_conv1d_update_ref,
    causal_conv1d_update_triton,
)
from hybridkv.kernels.mamba.mamba_ssm_compat import load_mamba_ssm, mamba_ssm_available
from hybridkv.kernels.mamba.scan_tiles import ScanTiles
from hybridkv.kernels.mamba.ssd_chunk_scan import (
    ssd_chunk_scan_fn,
    ssd_chunk_scan_fn_ref,
    ssd_chunk_scan_fn_triton,
)
from hybridkv.kernels.mamba.ssd_scan import ssd_scan_fn, ssd_scan_fn_ref, ssd_scan_fn_triton
from hybridkv.kernels.mamba.ssd_update import (
    ssd_state_update,
    ssd_state_update_ref,
    ssd_state_update_triton,
)
from hybridkv.kernels.mamba.ssm_chunk_scan import (
    selective_chunk_scan_fn,
    selective_chunk_scan_fn_ref,
    selective_chunk_scan_fn_triton,
)
from hybridkv.kernels.mamba.ssm_scan import (
    selective_scan_fn,
    selective_scan_fn_ref,
    selective_scan_fn_triton,
)
from hybridkv.kernels.mamba.ssm_update import (
    selective_state_update,
    selective_state_update_ref,
    selective_state_update_triton,
)

__all__ = [
    "ScanTiles",
    "causal_conv1d_fn",
    "causal_conv1d_fn_ref",
    "causal_conv1d_fn_triton",
    "causal_conv1d_update",
    "causal_conv1d_update_ref",
    "causal_conv1d_update_triton",
    "load_mamba_ssm",
    "mamba_ssm_available",
    "selective_chunk_scan_fn",
    "selective_chunk_scan_fn_ref",
    "selective_chunk_scan_fn_triton",
    "selective_scan_fn",
    "selective_scan_fn_ref",
    "selective_scan_fn_triton",
    "selective_state_update",
    "selective_state_update_ref",
    "selective_state_update_triton",
    "ssd_chunk_scan_fn",
    "ssd_chunk_scan_fn_ref",
    "ssd_chunk_scan_fn_triton",
    "ssd_scan_fn",
    "ssd_scan_fn_ref",
    "ssd_scan_fn_triton",
    "ssd_state_update",
    "ssd_state_update_ref",
    "ssd_state_update_triton",
]
