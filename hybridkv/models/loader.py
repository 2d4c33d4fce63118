"""Strict checkpoint loading: every tensor used, every parameter filled, every shape checked.

``load_checkpoint(model, model_dir, dtype)`` reads ``model.safetensors`` or the
shards named by ``model.safetensors.index.json`` and routes each tensor through
``model.checkpoint_tensors`` (which may rename, split or ignore it on purpose).
It raises ``CheckpointError`` (a ``ValueError``), listing the offending names,
when a tensor matches no parameter, a shape differs, a parameter is filled
twice, or a parameter is left unfilled. Returns the number of tensors ignored
on purpose (the vision tower of a multimodal checkpoint, for example).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from hybridkv.models.base import CausalLM


class CheckpointError(ValueError):
    """The checkpoint does not fit the model (names or shapes)."""


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a checkpoint directory (single file or sharded)."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(
                f"{index}: not a safetensors index (JSON with a 'weight_map' of names to "
                f"files): {type(e).__name__}: {e}"
            ) from None
        return [model_dir / s for s in shards]
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    found = sorted(model_dir.glob("*.safetensors"))
    if found:
        return found
    raise CheckpointError(f"{model_dir}: no *.safetensors weights found")


def iter_checkpoint(model_dir: Path, progress: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every tensor of the checkpoint, file by file."""
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(desc="loading weights", unit="tensor", dynamic_ncols=True)
    for path in checkpoint_files(model_dir):
        try:
            with safe_open(str(path), framework="pt") as f:
                names = list(f.keys())
                if bar is not None:
                    bar.total = (bar.total or 0) + len(names)
                for name in names:
                    yield name, f.get_tensor(name)
                    if bar is not None:
                        bar.update()
        except SafetensorError as e:
            raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None
    if bar is not None:
        bar.close()


def _short(names: list[str], limit: int = 8) -> str:
    more = f" ... and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def load_checkpoint(
    model: CausalLM, model_dir: Path, dtype: torch.dtype, *, progress: bool = False
) -> int:
    """Fill ``model``'s parameters from ``model_dir`` (see the module docstring)."""
    params = dict(model.named_parameters())
    filled: set[str] = set()
    unknown: list[str] = []
    mismatched: list[str] = []
    twice: list[str] = []
    ignored = 0
    with torch.no_grad():
        for name, tensor in iter_checkpoint(model_dir, progress):
            targets = model.checkpoint_tensors(name, tensor)
            if not targets:
                ignored += 1
                continue
            for pname, value in targets:
                param = params.get(pname)
                if param is None:
                    unknown.append(f"{name} (as {pname})" if pname != name else name)
                elif tuple(param.shape) != tuple(value.shape):
                    mismatched.append(
                        f"{pname}: checkpoint {tuple(value.shape)}, model {tuple(param.shape)}"
                    )
                elif pname in filled:
                    twice.append(pname)
                else:
                    param.copy_(value.to(dtype=param.dtype))
                    filled.add(pname)
    problems = []
    if unknown:
        problems.append(f"{len(unknown)} checkpoint tensors match no parameter: {_short(unknown)}")
    if mismatched:
        problems.append(f"{len(mismatched)} shapes differ: {_short(mismatched)}")
    if twice:
        problems.append(f"{len(twice)} parameters filled twice: {_short(twice)}")
    missing = sorted(set(params) - filled)
    if missing:
        problems.append(f"{len(missing)} parameters missing from the checkpoint: {_short(missing)}")
    if problems:
        raise CheckpointError(
            f"{model_dir}: the checkpoint does not fit {type(model).__name__}: "
            + "; ".join(problems)
        )
    return ignored
