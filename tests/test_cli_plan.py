"""``hybridkv plan``: the command's text, figure, input resolution and errors.

Expected figures are derived here from the layouts' dimensions (bytes per
token per layer = 2 (K, V) x kv heads x head dim x 2 (bf16)), not copied
from the planner's output.
"""

from __future__ import annotations

import re

import pytest

from hybridkv.cli import main
from hybridkv.common.units import format_bytes
from hybridkv.layouts import shipped_names
from hybridkv.report.table import format_table
from hybridkv.report.units import compact_indices, parse_memory


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["plan", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def section(out: str, title: str) -> list[str]:
    """The lines of the section starting with ``title`` (up to a blank line)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start:end]


def table(out: str, title: str) -> list[dict[str, str]]:
    """Rows of the table under ``title``, split on runs of 2+ spaces.

    A row may lack its last cells (trailing blanks are stripped): they read "".
    One-cell lines (notes and sums after the table) are left out.
    """
    head, *rows = section(out, title)[1:]
    keys = re.split(r"\s{2,}", head.strip())
    parsed = [re.split(r"\s{2,}", r.strip()) for r in rows]
    parsed = [r for r in parsed if len(r) > 1]
    assert all(len(r) <= len(keys) for r in parsed)
    return [dict(zip(keys, r + [""] * (len(keys) - len(r)), strict=True)) for r in parsed]


# --- Gemma 3 27B: 52 sliding (W=1024) + 10 full layers, 16 KV heads of 128 ----------

GEMMA_TOKEN = 2 * 16 * 128 * 2  # bytes per token per layer: 8,192
GEMMA_SLOT = 16 * GEMMA_TOKEN  # one 16-token block of one layer: 131,072
GEMMA_PAGE = 10 * GEMMA_SLOT  # g = 10 buffers (10 full layers, vLLM's min slot count)
GEMMA_SLIDING_BLOCKS = -(-(1024 - 1 + 8192) // 16) + 1  # window + one step, + 1: 577
GEMMA_PAGES_PER_REQUEST = 131072 // 16 + 6 * GEMMA_SLIDING_BLOCKS  # 1 full + 6 sliding groups


def test_gemma_3_27b_at_80gb_has_7_groups_with_vllm_grouping(capsys):
    rc, out, err = run(
        capsys, "gemma-3-27b", "--memory", "80GB", "--max-model-len", "131072", "--grouping", "vllm"
    )
    assert rc == 0 and err == ""
    assert out.startswith("Model gemma-3-27b: 62 layers (10 full, 52 sliding_window)")
    assert "Groups: 7 groups over 10 shared buffers" in out
    groups = table(out, "Groups:")
    assert [g["kind"] for g in groups] == ["sliding_window"] * 6 + ["full"]
    assert sum(int(g["layers"]) for g in groups) == 62
    assert sum(int(g["padding"]) for g in groups) == 60 - 52  # 6 sliding groups of 10 slots
    full = groups[-1]
    assert full["layer indices"] == ",".join(str(i) for i in range(5, 62, 6))
    assert full["blocks/request"] == "8,192"
    assert {g["blocks/request"] for g in groups[:-1]} == {f"{GEMMA_SLIDING_BLOCKS}"}
    num_blocks = 80 * 10**9 // GEMMA_PAGE
    assert f"({GEMMA_SLOT:,} B)" in out and f"({GEMMA_PAGE:,} B)" in out
    assert f"num_blocks                              {num_blocks:,} (block 0" in out
    conc = (num_blocks - 1) / GEMMA_PAGES_PER_REQUEST
    naive = 80 * 10**9 / (62 * 131072 * GEMMA_TOKEN)
    cap = {row["allocation"].split(" (")[0]: row for row in table(out, "Capacity")}
    assert cap["this plan"]["max concurrency"] == f"{conc:.2f}" == "5.24"
    assert cap["naive"]["max concurrency"] == f"{naive:.2f}" == "1.20"
    assert cap["this plan"]["KV tokens"] == f"{int(conc * 131072):,}"
    assert f"gain over naive: {conc / naive:.2f}x" in out
    assert "gain over vllm grouping: 1.000x (vllm grouping: 7 groups, 8 padding layers" in out


def test_max_model_len_defaults_to_the_layouts(capsys):
    rc, out, _ = run(capsys, "gemma-3-27b", "--memory", "80GB")
    assert rc == 0
    assert "max_model_len 131,072, max_num_batched_tokens 8,192" in out


# --- toy layouts ------------------------------------------------------------------


def test_toy_figures_by_hand(capsys):
    # 1 full + 3 sliding (W=32) layers, 2 KV heads of 64: 512 B per token, 8 KiB
    # blocks, g = 1 (vLLM: min slot count 1). A 1,024-token request holds 64 full
    # blocks and, with 64-token steps, cdiv(31 + 64, 16) + 1 = 7 per sliding layer.
    rc, out, _ = run(
        capsys, "toy-1full-3sliding", "--memory", "4MiB", "--max-num-batched-tokens", "64"
    )
    assert rc == 0
    assert [g["blocks/request"] for g in table(out, "Groups:")] == ["64", "7", "7", "7"]
    per_request = 64 + 3 * 7  # pages of 8 KiB
    conc = (4 * 2**20 // 8192 - 1) / per_request
    cap = {row["allocation"].split(" (")[0]: row for row in table(out, "Capacity")}
    assert cap["this plan"]["bytes/request"] == format_bytes(per_request * 8192)
    assert cap["this plan"]["max concurrency"] == f"{conc:.2f}"
    assert cap["naive"]["max concurrency"] == f"{4 * 2**20 / (4 * 1024 * 512):.2f}"
    assert f"gain over naive: {conc / 2:.2f}x" in out


def test_auto_grouping_beats_vllm_on_20_full_30_sliding(capsys):
    # 20 full + 30 sliding layers, 8 KV heads of 128: slot 64 KiB. vLLM: g = 20 (30 <
    # 1.5 x 20 fails), 1 full + 2 sliding groups, 10 padding layers; auto: g = 10,
    # 2 full + 3 sliding groups, no padding.
    rc, out, _ = run(capsys, "20full-30sliding", "--memory", "40GiB")
    assert rc == 0
    assert "Groups: 5 groups over 10 shared buffers" in out
    sliding = -(-(1023 + 8192) // 16) + 1
    slot = 16 * 2 * 8 * 128 * 2
    auto = (40 * 2**30 // (10 * slot) - 1) / (3 * sliding + 2 * 2048)
    vllm = (40 * 2**30 // (20 * slot) - 1) / (2 * sliding + 2048)
    assert f"gain over vllm grouping: {auto / vllm:.3f}x" in out
    assert "(vllm grouping: 3 groups, 10 padding layers" in out
    assert "Grouping choices" not in out


def test_verbose_lists_every_choice_and_marks_them(capsys):
    rc, out, _ = run(capsys, "20full-30sliding", "--memory", "40GiB", "--verbose")
    assert rc == 0
    rows = table(out, "Grouping choices")
    assert [int(r["g"]) for r in rows] == list(range(1, 31))
    notes = {int(r["g"]): r["note"] for r in rows}
    assert notes[10] == "chosen" and notes[20] == "vllm"
    # groups = cdiv(20, g) + cdiv(30, g); the cap is max(3, 8) = 8
    over = {g for g in range(1, 31) if -(-20 // g) + -(-30 // g) > 8}
    assert over == {1, 2, 3, 4, 5, 6}
    assert {g for g, n in notes.items() if "over cap" in n} == over
    assert {int(r["g"]): int(r["groups"]) for r in rows}[7] == 3 + 5
    assert "cap 8 groups = max(vllm's 3, --max-groups 8)" in out


# --- unification -------------------------------------------------------------------

# Jamba v0.1: Mamba1 state (conv 3 x 8192 + SSM 8192 x 16, bf16) = 311,296 B; attention
# 8 KV heads of 128: 4,096 B per token. vLLM: one attention page holds a state:
# 16 * cdiv(311296, 16 * 4096) = 80 tokens. Packed, 4 attention layers per slot:
# 16 * cdiv(311296, 16 * 4096 * 4) = 32 tokens.
JAMBA_STATE = (3 * 8192 + 8192 * 16) * 2


def test_packed_unification_shrinks_jambas_attention_blocks(capsys):
    rc, out, _ = run(capsys, "jamba-v0.1", "--memory", "80GB", "--unification", "packed")
    assert rc == 0
    rows = {r["unification"]: r for r in table(out, "Unification strategies")}
    assert rows["vllm"]["attn block"] == "80"
    assert rows["packed (this plan)"]["attn block"] == "32"
    packed_slot = 4 * 32 * 4096
    assert rows["packed (this plan)"]["slot"] == format_bytes(packed_slot)
    pad = 100 * (packed_slot - JAMBA_STATE) / JAMBA_STATE
    assert rows["packed (this plan)"]["Mamba padding"] == f"+{pad:.1f}%"
    assert rows["vllm"]["Mamba padding"] == f"+{100 * (80 * 4096 - JAMBA_STATE) / JAMBA_STATE:.1f}%"
    full = table(out, "Groups:")[-1]
    assert (full["kind"], full["block"], full["per slot"]) == ("full", "32", "4")
    assert full["layer indices"] == "4,12,20,28"


def test_the_other_strategys_error_is_printed(capsys, tmp_path):
    # Packed unification needs one attention page size next to Mamba layers.
    path = tmp_path / "mixed.yaml"
    path.write_text(
        "name: mixed\nmax_model_len: 4096\nlayer_kinds:\n"
        "  m: {kind: mamba2, n_heads: 8, head_dim: 64, n_groups: 1, d_state: 64, d_conv: 4}\n"
        "  f: {kind: full, num_kv_heads: 8, head_dim: 64}\n"
        "  s: {kind: sliding_window, sliding_window: 256, num_kv_heads: 4, head_dim: 64}\n"
        "layers: [m, f, m, s]\n"
    )
    rc, out, _ = run(capsys, str(path), "--memory", "1GiB")
    assert rc == 0
    lines = section(out, "Unification strategies")
    assert lines[-1].startswith("  packed: not possible: packed unification with Mamba layers")


# --- inputs ------------------------------------------------------------------------


def test_a_yaml_file_path(capsys, tmp_path):
    path = tmp_path / "mine.yml"
    path.write_text(
        "name: mine\nmax_model_len: 2048\nlayer_kinds:\n"
        "  f: {kind: full, num_kv_heads: 2, head_dim: 64}\n"
        "  s: {kind: sliding_window, sliding_window: 128, num_kv_heads: 2, head_dim: 64}\n"
        "pattern: [s, s, s, f]\nnum_layers: 8\n"
    )
    rc, out, _ = run(capsys, str(path), "--memory", "64MiB", "--grouping", "vllm")
    assert rc == 0
    assert out.startswith("Model mine: 8 layers (2 full, 6 sliding_window)")
    assert "max_model_len 2,048" in out
    groups = table(out, "Groups:")  # g = 2: three sliding groups, one full group
    assert [(g["kind"], g["layer indices"]) for g in groups] == [
        ("sliding_window", "0,4"),
        ("sliding_window", "1,5"),
        ("sliding_window", "2,6"),
        ("full", "3,7"),
    ]


def test_a_hugging_face_model_directory(capsys, tmp_path):
    from transformers import Gemma3TextConfig

    Gemma3TextConfig(
        num_hidden_layers=12,
        num_key_value_heads=2,
        head_dim=64,
        sliding_window=128,
        max_position_embeddings=4096,
    ).save_pretrained(tmp_path / "tiny-g3")
    rc, out, _ = run(capsys, str(tmp_path / "tiny-g3"), "--memory", "1GiB")
    assert rc == 0
    assert out.startswith("Model tiny-g3: 12 layers (2 full, 10 sliding_window)")
    assert "max_model_len 4,096" in out


def test_unknown_name_lists_the_shipped_ones(capsys):
    rc, out, err = run(capsys, "gemma-9-1t", "--memory", "80GB")
    assert rc == 2 and out == ""
    assert err.startswith("hybridkv plan: error: no model 'gemma-9-1t'")
    assert all(name in err for name in shipped_names())
    assert "Traceback" not in err


def test_a_bad_yaml_file_exits_2_naming_the_file(capsys, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\nmax_model_len: 1024\nlayers: [nope]\n")
    rc, _, err = run(capsys, str(path), "--memory", "1GiB")
    assert rc == 2
    assert str(path) in err and "unknown layer kind 'nope'" in err
    assert len(err.strip().splitlines()) == 2  # the message, no traceback


def test_too_small_memory_exits_2_with_the_minimum(capsys):
    rc, out, err = run(capsys, "gemma-3-27b", "--memory", "1GiB")
    assert rc == 2 and out == ""
    minimum = (GEMMA_PAGES_PER_REQUEST + 1) * GEMMA_PAGE  # + the null block
    assert err.startswith("hybridkv plan: error: 1,073,741,824 bytes cannot hold")
    assert f"{minimum:,} bytes" in err
    assert "\n" not in err.strip()


def test_a_bad_memory_size_exits_2(capsys):
    rc, _, err = run(capsys, "gemma-3-27b", "--memory", "80 gigs")
    assert rc == 2
    assert "cannot read memory size '80 gigs'" in err and "GiB" in err


# --- --plot --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gemma-3-27b", "jamba-v0.1"])
def test_plot_writes_a_png(capsys, tmp_path, name):
    path = tmp_path / "layout.png"
    rc, out, _ = run(capsys, name, "--memory", "80GB", "--plot", str(path))
    assert rc == 0
    assert out.endswith(f"figure written to {path}\n")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width > 800 and height > 300 and len(data) > 20_000


def test_plot_to_an_unwritable_path_exits_2(capsys, tmp_path):
    rc, _, err = run(
        capsys, "gemma-3-27b", "--memory", "80GB", "--plot", str(tmp_path / "no/x.png")
    )
    assert rc == 2 and "cannot write the figure" in err


# --- units -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("40GiB", 40 * 2**30),
        ("80GB", 80 * 10**9),
        ("512MiB", 512 * 2**20),
        ("1073741824", 2**30),
        ("1_000", 1000),
        ("2 kib", 2048),
        ("1.5GiB", 3 * 2**29),
        ("7B", 7),
        ("1TB", 10**12),
    ],
)
def test_parse_memory(text, expected):
    assert parse_memory(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "40GX", "-5GiB", "4 0GiB", "1e9", "40 G"])
def test_parse_memory_rejects_with_the_suffixes(text):
    with pytest.raises(ValueError, match="KB, MB, GB, TB, KiB, MiB, GiB, TiB"):
        parse_memory(text)


@pytest.mark.parametrize("text", ["0", "0.4B", "0GiB"])
def test_parse_memory_rejects_less_than_a_byte(text):
    with pytest.raises(ValueError, match="less than one byte"):
        parse_memory(text)


def test_format_bytes_and_compact_indices():
    assert format_bytes(512) == "512 B"
    assert format_bytes(131072) == "128.00 KiB"
    assert format_bytes(80 * 10**9) == "74.51 GiB"
    assert compact_indices([6, 0, 1, 2, 3, 4, 7, 8, 9, 10]) == "0-4,6-10"
    assert compact_indices([4, 12, 5]) == "4,5,12"
    assert compact_indices([]) == ""


def test_format_table_aligns_numbers_right_and_lists_left():
    lines = format_table(["g", "layers"], [[1, "0,7"], [10, "5,11,17"]], left=["layers"])
    assert lines == ["   g  layers", "   1  0,7", "  10  5,11,17"]
