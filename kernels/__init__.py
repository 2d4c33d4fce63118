"""hybridkv.kernels: ops on the shared paged KV layout.

Empty until the kernels issue lands (KV write, unified paged attention, Mamba
state updates; Triton on GPU, torch references on CPU). Importable only as
``hybridkv.kernels``: a top-level ``kernels`` package would shadow Hugging
Face's hub-kernels package.
"""
