"""Imported first by ``hybridkv.kernels``: the kernels need the ``engine`` extra (torch)."""

from hybridkv.common.extras import require

require("torch", "engine", "hybridkv.kernels")
