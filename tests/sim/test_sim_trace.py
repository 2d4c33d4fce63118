"""Reading traces: Mooncake expansion, token prompts, arrivals, and every bad line."""

from __future__ import annotations

import pytest

from hybridkv.sim.trace import MAX_HASH_ID, OUTPUT_TOKEN_BASE, TraceError, load_trace


def mooncake(ts: int, n_in: int, n_out: int, hash_ids: list[int]) -> dict:
    return {"timestamp": ts, "input_length": n_in, "output_length": n_out, "hash_ids": hash_ids}


def test_hash_ids_expand_to_disjoint_512_token_ranges_cut_to_input_length(write_trace):
    path = write_trace([mooncake(0, 700, 3, [0, 1]), mooncake(1500, 1536, 1, [5, 6, 9])])
    a, b = load_trace(path)
    assert a.prompt_token_ids() == list(range(0, 700))  # 0..511 from id 0, 512..699 from id 1
    assert b.prompt_token_ids() == [*range(2560, 3584), *range(4608, 5120)]
    assert (a.line, a.arrival_s, a.input_length, a.output_length) == (1, 0.0, 700, 3)
    assert (b.arrival_s, b.num_tokens) == (1.5, 1537)


def test_requests_sharing_k_hash_ids_share_exactly_k_times_512_tokens(write_trace):
    path = write_trace([mooncake(0, 1536, 1, [5, 6, 7]), mooncake(0, 1536, 1, [5, 6, 9])])
    a, b = (r.prompt_token_ids() for r in load_trace(path))
    shared = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
    assert shared == 2 * 512
    assert not set(a[1024:]) & set(b[1024:])


def test_token_prompts_and_inherited_timestamps(write_trace):
    path = write_trace(
        [
            {"timestamp": 250, "prompt_token_ids": [7, 8, 9], "output_length": 2},
            {"prompt_token_ids": [7, 8], "output_length": 1},  # arrives with the line before
            "",
            {"timestamp": 1000, "prompt_token_ids": [1], "output_length": 5},
        ]
    )
    reqs = load_trace(path)
    assert [r.prompt_token_ids() for r in reqs] == [[7, 8, 9], [7, 8], [1]]
    assert [r.arrival_s for r in reqs] == [0.25, 0.25, 1.0]
    assert [r.line for r in reqs] == [1, 2, 4]


def test_limit_and_fixed_output_tokens(write_trace):
    path = write_trace([mooncake(i, 10, 3, [i]) for i in range(5)] + ["not json"])
    reqs = load_trace(path, limit=3, output_tokens=7)
    assert [r.output_length for r in reqs] == [7, 7, 7]
    assert len(reqs) == 3  # the bad line after the limit is never read


def test_the_shipped_conversation_trace_reads_as_the_readme_says():
    reqs = load_trace("/work/shared/traces/mooncake_conversation.jsonl", limit=3)
    assert [r.input_length for r in reqs] == [6758, 7322, 7236]
    assert all(len(r.prompt_token_ids()) == r.input_length for r in reqs)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("{not json", "trace.jsonl:2: not JSON"),
        ("[1, 2]", "trace.jsonl:2: expected a JSON object, got list"),
        ({"output_length": 1, "hash_ids": [0]}, "trace.jsonl:2: missing 'input_length'"),
        ({"input_length": 5, "output_length": 1}, "trace.jsonl:2: missing 'hash_ids'"),
        (mooncake(20, -5, 1, [0]), "trace.jsonl:2: input_length must be >= 1, got -5"),
        (mooncake(20, 5, -1, [0]), "trace.jsonl:2: output_length must be >= 1, got -1"),
        (mooncake(20, 5, 0, [0]), "output_length must be >= 1, got 0"),
        (mooncake(20, 5.5, 1, [0]), "input_length must be an integer, got 5.5"),
        (mooncake(20, 600, 1, [0]), "1 hash_ids cover 512 tokens, fewer than input_length=600"),
        (mooncake(20, 5, 1, [-1]), f"every entry must be an int in [0, {MAX_HASH_ID}]"),
        (mooncake(20, 5, 1, [MAX_HASH_ID + 1]), "hash_ids holds 4194304"),
        (mooncake(20, 5, 1, []), "hash_ids must be a non-empty list"),
        ({"prompt_token_ids": [1], "output_length": 1, "timestamp": -3}, "timestamp must be"),
        ({"timestamp": 20, "input_length": 5, "hash_ids": [0]}, "missing 'output_length'"),
        (
            {"prompt_token_ids": [OUTPUT_TOKEN_BASE], "output_length": 1},
            "prompt_token_ids holds 2147483648",
        ),
        (mooncake(10, 5, 1, [0]), "timestamp 10 goes back in time"),
    ],
)
def test_bad_lines_name_file_line_and_field(write_trace, row, message):
    path = write_trace([mooncake(20, 5, 1, [0]), row])
    with pytest.raises(TraceError) as e:
        load_trace(path)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_unreadable_and_empty_traces(tmp_path, write_trace):
    with pytest.raises(TraceError, match=r"cannot read trace .*missing\.jsonl"):
        load_trace(tmp_path / "missing.jsonl")
    with pytest.raises(TraceError, match="holds no request"):
        load_trace(write_trace(["", "  "]))
