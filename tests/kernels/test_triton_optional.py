"""``hybridkv.kernels`` without Triton: importable, the torch ops run, asking for Triton
raises the clear error (the Triton modules load only when a Triton kernel runs)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# Runs in a fresh interpreter where ``import triton`` fails: a ``None`` entry in
# sys.modules makes the import raise ModuleNotFoundError and find_spec answer None,
# exactly as when the package is not installed.
_SCRIPT = textwrap.dedent(
    """
    import os, sys
    os.environ["TRITON_INTERPRET"] = "1"  # so only the missing package can refuse Triton
    os.environ.pop("HYBRIDKV_KERNEL_BACKEND", None)
    for name in ("triton", "triton.language"):
        sys.modules[name] = None

    import torch
    import hybridkv.kernels as K
    from hybridkv.kernels.mamba import causal_conv1d_fn

    cpu = torch.device("cpu")
    k = torch.randn(3, 2, 4)
    cache = torch.zeros(2, 4, 2, 4)
    K.reshape_and_cache(k, k, cache, cache.clone(), torch.tensor([0, 5, -1]))
    assert torch.equal(cache[1, 1], k[1])
    x = torch.randn(5, 8)
    conv = torch.zeros(3, 3, 8)
    out = causal_conv1d_fn(x, torch.randn(8, 4), None, "silu", conv, torch.tensor([0, 5]),
                           torch.tensor([-1]), torch.full((5,), -1), backend="torch")
    assert out.shape == (5, 8)
    print(K.get_backend("torch", cpu).describe())
    for ask in (lambda: K.get_backend("triton", cpu),
                lambda: K.reshape_and_cache(k, k, cache, cache, torch.zeros(3, dtype=torch.long),
                                            backend="triton")):
        try:
            ask()
        except K.KernelBackendError as exc:
            print("refused:", exc)
        else:
            raise SystemExit("Triton was not refused")
    loaded = sorted(m for m in sys.modules if m.endswith("_triton") or "launcher" in m)
    print("triton modules loaded:", loaded)
    """
)


def test_kernels_import_and_run_without_triton() -> None:
    run = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, check=False, timeout=300
    )
    assert run.returncode == 0, run.stderr
    refusals = [line for line in run.stdout.splitlines() if line.startswith("refused:")]
    assert refusals == ["refused: backend='triton': Triton is not installed"] * 2
    assert "triton modules loaded: []" in run.stdout
    assert "kernel backend 'torch'" in run.stdout
