"""Convert a GGUF file into an ordinary Hugging Face checkpoint directory.

transformers can read a GGUF directly (`from_pretrained(dir, gguf_file=name)`), but every load
re-parses the 262k-entry vocabulary, rebuilds the tokenizer and de-quantises every tensor: about
35 s for Gemma 3 270M on two cores. `convert_gguf` pays that once and writes what a plain
`from_pretrained(out_dir)` reads in a second or two:

    out_dir/
      config.json              model_type, "dtype": "float32", tie_word_embeddings, ...
      generation_config.json   bos/eos/pad ids from the GGUF
      model.safetensors        the de-quantised weights, float32, bit for bit what transformers
                               produces from the GGUF (no rounding to bf16); a tied lm_head is
                               not stored twice
      tokenizer.json, tokenizer_config.json, chat_template.jinja (if the GGUF has a template)
      hybridkv-gguf.json       provenance; written last, so its presence means "complete"

The directory appears atomically: everything is written into a temporary sibling
(`.<name>.tmp-XXXX` in the same parent) which is renamed to `out_dir` only once complete. A
failed conversion removes its temporary directory; a killed one may leave it behind, but it is
never mistaken for a checkpoint.

Needs the `gguf` and `accelerate` packages (`pip install 'hybridkv[demo]'`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import struct
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hybridkv.common.extras import install_command
from hybridkv.common.user_errors import one_line

GGUF_MAGIC = b"GGUF"
"""The first four bytes of every GGUF file (llama.cpp's `GGUF_MAGIC`, 0x46554747 little-endian)."""

MARKER_NAME = "hybridkv-gguf.json"
"""Written last into a converted checkpoint: its presence means the directory is complete."""

INSTALL_HINT = install_command("demo")

_REQUIRED_PACKAGES = ("gguf", "accelerate")


#: The first transformers version whose GGUF tokenizer conversion was checked here. 5.17's
#: is wrong: Gemma 3 270M's loses its BOS and splits words differently, and once saved and
#: reloaded it is character by character (``tests/engine/test_gguf.py`` sees the same on a
#: tiny vocabulary). Older versions need ``convert_gguf(..., tokenizer_dir=...)``.
TOKENIZER_CHECKED_SINCE = "5.23"


def _transformers_version() -> str:
    import transformers

    return str(transformers.__version__)


def check_tokenizer_conversion(tokenizer_dir: str | os.PathLike[str] | None) -> None:
    """Raise ``RuntimeError`` when the installed transformers would convert a GGUF's
    tokenizer wrongly (before ``TOKENIZER_CHECKED_SINCE``) and no ``tokenizer_dir`` is
    given; a given ``tokenizer_dir`` must be a directory."""
    if tokenizer_dir is not None:
        if not Path(tokenizer_dir).is_dir():
            raise FileNotFoundError(f"tokenizer_dir {tokenizer_dir} is not a directory")
        return
    from packaging.version import Version

    version = _transformers_version()
    if Version(version) < Version(TOKENIZER_CHECKED_SINCE):
        raise RuntimeError(
            f"transformers {version} converts GGUF tokenizers wrongly (5.17: Gemma 3's "
            f"splits words differently, and is character by character once saved); install "
            f"transformers >= {TOKENIZER_CHECKED_SINCE}, or pass tokenizer_dir= a tokenizer "
            "saved by one"
        )


def is_gguf(path: str | os.PathLike[str]) -> bool:
    """True if `path` names a GGUF file: its name ends in `.gguf` (the file need not exist yet),
    or it is an existing file that starts with the GGUF magic bytes."""
    p = Path(path)
    if p.suffix.lower() == ".gguf":
        return True
    return p.is_file() and _starts_with_magic(p)


def is_converted(out_dir: str | os.PathLike[str]) -> bool:
    """True if `out_dir` is a complete checkpoint written by `convert_gguf` (its marker exists)."""
    return (Path(out_dir) / MARKER_NAME).is_file()


def require_gguf_support() -> None:
    """Raise ImportError naming the install command if `gguf` or `accelerate` is missing."""
    missing = [name for name in _REQUIRED_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(
            f"reading a GGUF file needs the {' and '.join(missing)} package"
            f"{'s' if len(missing) > 1 else ''}: {INSTALL_HINT}"
        )


def convert_gguf(
    gguf_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    progress: bool = True,
    tokenizer_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Convert `gguf_path` into a Hugging Face checkpoint at `out_dir` and return `out_dir`.

    The tokenizer comes from the GGUF's metadata, or from `tokenizer_dir` (a saved Hugging
    Face tokenizer) when given: transformers before `TOKENIZER_CHECKED_SINCE` converts GGUF
    tokenizers wrongly, so there the conversion needs it (RuntimeError otherwise).

    The weights are the float32 tensors transformers de-quantises from the GGUF, saved unchanged;
    `config.json` records `"dtype": "float32"`. `out_dir` must not exist yet (FileExistsError
    otherwise): the result appears in one rename, or not at all.

    `progress` prints one line per step with its time, and transformers' own progress bars. (The
    de-quantisation bar of transformers' legacy GGUF reader is a bare tqdm it always draws.)

    Raises FileNotFoundError (no such file or `tokenizer_dir`), ValueError (not a GGUF
    file), FileExistsError (`out_dir` exists), ImportError (`gguf`/`accelerate` missing)
    and RuntimeError (see `tokenizer_dir`).
    """
    src = Path(gguf_path)
    out = Path(out_dir)
    if not src.is_file():
        raise FileNotFoundError(f"GGUF file not found: {src}")
    if not _starts_with_magic(src):
        raise ValueError(
            f"{src} is not a GGUF file: it does not start with the magic bytes {GGUF_MAGIC!r}"
        )
    if out.exists():
        raise FileExistsError(
            f"output directory {out} already exists; remove it or choose another out_dir"
        )
    require_gguf_support()
    check_tokenizer_conversion(tokenizer_dir)
    check_gguf_header(src)

    started = time.perf_counter()
    with _progress_bars(progress):
        with timed_step("loading GGUF weights (de-quantising to float32)", progress):
            try:
                model = _load_model(src)
            except (ValueError, KeyError, IndexError, EOFError, OSError, struct.error) as e:
                raise ValueError(
                    f"{src}: not a readable GGUF file ({type(e).__name__}: {one_line(e)})"
                ) from e
        if tokenizer_dir is None:
            with timed_step("building the tokenizer from GGUF metadata", progress):
                tokenizer = _load_tokenizer(src, model.config.model_type)
        else:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        out.parent.mkdir(parents=True, exist_ok=True)
        # Not tempfile.mkdtemp, which makes the folder 0700: the checkpoint gets the umask's mode.
        tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        tmp.mkdir()
        try:
            with timed_step(f"writing the checkpoint to {out}", progress):
                model.save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)
                _check_saved_weights(tmp, tied=bool(model.config.tie_word_embeddings))
                _write_marker(tmp, src, seconds=time.perf_counter() - started)
            try:
                tmp.rename(out)
            except OSError as exc:
                if out.exists():  # another process finished the same conversion first
                    raise FileExistsError(f"{out} appeared while converting") from exc
                raise
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return out


@contextmanager
def timed_step(label: str, enabled: bool = True) -> Iterator[None]:
    """Print `hybridkv: <label> ...` and, when the block finishes, its wall time (to stderr)."""
    if not enabled:
        yield
        return
    print(f"hybridkv: {label} ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    yield
    print(
        f"hybridkv: {label}: done in {time.perf_counter() - start:.1f} s",
        file=sys.stderr,
        flush=True,
    )


#: GGUF versions the reader understands (v1 is long retired).
GGUF_VERSIONS = (2, 3)
_HEADER = struct.Struct("<4sIQQ")  # magic, version, tensor count, metadata count
#: Fewer bytes than any tensor info or metadata entry can take.
_MIN_ENTRY_BYTES = 8


def check_gguf_header(path: Path) -> None:
    """Raise ``ValueError`` naming ``path`` unless its header is a plausible GGUF one.

    Checks the magic, the version, and that the tensor and metadata counts fit
    in the file (garbage after the magic gives absurd counts), so a corrupt
    file fails in a line, not deep inside the reader.
    """
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(_HEADER.size)
    if len(head) < _HEADER.size:
        if head[: len(GGUF_MAGIC)] != GGUF_MAGIC:
            raise ValueError(f"{path} is not a GGUF file: it does not start with {GGUF_MAGIC!r}")
        raise ValueError(f"{path}: a GGUF file cut short ({size} bytes, less than its header)")
    magic, version, n_tensors, n_meta = _HEADER.unpack(head)
    if magic != GGUF_MAGIC:
        raise ValueError(f"{path} is not a GGUF file: it does not start with {GGUF_MAGIC!r}")
    if version not in GGUF_VERSIONS:
        raise ValueError(f"{path}: GGUF version {version} is not supported (only {GGUF_VERSIONS})")
    if (n_tensors + n_meta) * _MIN_ENTRY_BYTES > size - _HEADER.size:
        raise ValueError(
            f"{path}: corrupt or truncated GGUF: its header lists {n_tensors:,} tensors and "
            f"{n_meta:,} metadata entries, more than its {size:,} bytes can hold"
        )


def _starts_with_magic(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(len(GGUF_MAGIC)) == GGUF_MAGIC


@contextmanager
def _progress_bars(enabled: bool) -> Iterator[None]:
    """Switch transformers' progress bars to `enabled` for the block, then restore them."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    if enabled:
        hf_logging.enable_progress_bar()
    else:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
        else:
            hf_logging.disable_progress_bar()


def _load_model(src: Path) -> Any:
    """The GGUF's model with dense float32 weights and no quantizer attached (so it saves)."""
    import torch
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"gguf_file": src.name, "dtype": torch.float32}
    try:  # transformers >= 5.2x can keep GGUF blocks packed; ask for dense weights explicitly
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:  # older transformers always de-quantises GGUF weights
        pass
    model = AutoModelForCausalLM.from_pretrained(src.parent, **kwargs)

    not_dense = [
        name
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]
        if tensor.is_meta or (name.endswith(".weight") and not tensor.is_floating_point())
    ]
    if not_dense:
        raise RuntimeError(
            f"transformers left {len(not_dense)} GGUF tensors packed or unloaded "
            f"(e.g. {not_dense[:3]}); cannot write them as a plain checkpoint"
        )
    # The weights are plain tensors now; the GGUF "quantizer" only blocks save_pretrained.
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    return model


def _load_tokenizer(src: Path, model_type: str) -> Any:
    """The GGUF's tokenizer. Naming its type skips a second parse of the GGUF metadata for
    the config (Gemma 3 270M: 4.5 s instead of 29 s on 2 cores); the result is identical."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(
            src.parent, gguf_file=src.name, tokenizer_type=model_type
        )
    except ValueError:  # model_type has no tokenizer class registered: let transformers decide
        return AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)


def _check_saved_weights(ckpt: Path, *, tied: bool) -> None:
    """Internal invariant: one safetensors checkpoint, and a tied lm_head not stored twice."""
    from safetensors import safe_open

    files = sorted(ckpt.glob("*.safetensors"))
    if not files:
        raise RuntimeError(f"save_pretrained wrote no safetensors file into {ckpt}")
    names: set[str] = set()
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            names.update(f.keys())
    if tied and "lm_head.weight" in names:
        raise RuntimeError("tie_word_embeddings is set but lm_head.weight was saved as well")


def _write_marker(ckpt: Path, src: Path, *, seconds: float) -> None:
    import transformers

    info = {
        "format": 1,
        "source": src.name,
        "source_bytes": src.stat().st_size,
        "dtype": "float32",
        "transformers": transformers.__version__,
        "seconds": round(seconds, 1),
    }
    (ckpt / MARKER_NAME).write_text(json.dumps(info, indent=2) + "\n")
