"""Our KV event batches decode with vLLM 0.33's own classes, byte for byte.

The payloads a publisher sends (fetched back through its replay socket) for a
three-group hybrid workload with a LoRA request, evictions and a reset, with
integer hashes (vLLM's default) and with raw bytes, are decoded in a separate
process by ``msgspec.msgpack.Decoder(type=KVEventBatch)`` from vLLM's source
(``tests/vllm_kv_events_decode.py``). Every field must equal what the events
say, and vLLM's encoder must give back exactly our bytes. Skipped when the vLLM
baseline (``../shared/bench/vllm_baseline/setup.sh``) is not set up.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

zmq = pytest.importorskip("zmq")
msgspec = pytest.importorskip("msgspec")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from factories import config, full, mamba, manager, prefill, req, swa  # noqa: E402
from vllm_ref.source import default_harness, default_vllm_src  # noqa: E402

from hybridkv import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent  # noqa: E402
from hybridkv.events import KVEventsConfig, open_publisher  # noqa: E402

HAVE_VLLM = (default_vllm_src() / "vllm" / "distributed" / "kv_events.py").is_file() and (
    default_harness() / "vllm_shim.py"
).is_file()
pytestmark = pytest.mark.skipif(
    not HAVE_VLLM, reason="vLLM source absent (bash ../shared/bench/vllm_baseline/setup.sh)"
)

SPECS = (full(4), swa(4, 6), mamba(4))
KINDS = ["full_attention", "sliding_window", "mamba"]
WINDOWS = [None, 6, None]


def run_workload(int_hashes: bool) -> tuple[list[bytes], list[list[KVCacheEvent]]]:
    """Publish a small workload; return the payloads sent and each batch's events."""
    kv = manager(16, *SPECS, max_model_len=64, enable_kv_cache_events=True)
    cfg = KVEventsConfig(
        endpoint="tcp://127.0.0.1:*",
        replay_endpoint="tcp://127.0.0.1:*",
        topic="kv",
        int_block_hashes=int_hashes,
    )
    published: list[list[KVCacheEvent]] = []
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        with open_publisher(cfg, config(16, *SPECS), "cpu") as pub:

            def step() -> None:
                events = kv.take_events()
                if events:
                    published.append(events)
                pub.publish(events)

            for i, prompt in enumerate((list(range(10, 23)), [*range(10, 19), 90, 91])):
                r = req(f"a{i}", prompt, lora_name="adapter-1" if i else None)
                prefill(kv, r)
                step()
                kv.free(r)
            prefill(kv, big := req("big", list(range(200, 216))))  # evicts under pressure
            step()
            kv.free(big)
            assert kv.reset_prefix_cache()
            step()
            pub.flush()
            dealer.connect(pub.replay_endpoint)
            dealer.send_multipart([b"", (0).to_bytes(8, "big")])
            payloads = []
            while True:
                assert dealer.poll(5000), "replay timed out"
                _, _, seq, payload = dealer.recv_multipart()
                if not payload:
                    break
                assert int.from_bytes(seq, "big") == len(payloads)
                payloads.append(payload)
    finally:
        dealer.close()
        ctx.term()
    kinds = {type(e) for batch in published for e in batch}
    assert kinds == {BlockStored, BlockRemoved, AllBlocksCleared}, kinds
    return payloads, published


def expected(events: list[KVCacheEvent], int_hashes: bool) -> list[dict[str, Any]]:
    """vLLM's view of each event, written out from the event itself."""

    def h(x: bytes | None) -> Any:
        if x is None:
            return None
        return int.from_bytes(x[-8:], "big") if int_hashes else {"hex": x.hex()}

    none = dict.fromkeys(("locality", "ownership"))
    out: list[dict[str, Any]] = []
    for e in events:
        if isinstance(e, BlockStored):
            g = e.group_id
            out.append(
                {
                    "class": "BlockStored",
                    "block_hashes": [h(x) for x in e.block_hashes],
                    "parent_block_hash": h(e.parent_block_hash),
                    "token_ids": e.token_ids,
                    "block_size": e.block_size,
                    "lora_id": None,
                    "medium": "CPU",
                    "lora_name": e.lora_name,
                    "extra_keys": None,
                    "group_idx": g,
                    "kv_cache_spec_kind": KINDS[g],
                    "kv_cache_spec_sliding_window": WINDOWS[g],
                    "session_id": None,
                    "lookahead_token_ids": None,
                    **none,
                }
            )
        elif isinstance(e, BlockRemoved):
            out.append(
                {
                    "class": "BlockRemoved",
                    "block_hashes": [h(x) for x in e.block_hashes],
                    "medium": "CPU",
                    "group_idx": e.group_id,
                    **none,
                }
            )
        else:
            out.append({"class": "AllBlocksCleared"})
    return out


def test_vllm_decodes_our_batches_to_the_same_events(tmp_path: Path) -> None:
    runs = [(flag, *run_workload(flag)) for flag in (True, False)]
    payloads = [p for _, ps, _ in runs for p in ps]
    (tmp_path / "payloads.msgpack").write_bytes(msgspec.msgpack.encode(payloads))
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "vllm_kv_events_decode.py"),
            str(tmp_path / "payloads.msgpack"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert Path(result["vllm_file"]).is_relative_to(default_vllm_src())
    decoded = result["batches"]
    want = [expected(events, flag) for flag, _, batches in runs for events in batches]
    assert len(decoded) == len(want) == len(payloads)
    for got, events in zip(decoded, want, strict=True):
        assert got["same_bytes"], "vLLM re-encodes the batch to different bytes"
        assert got["data_parallel_rank"] == 0 and abs(got["ts"] - time.time()) < 600
        assert got["events"] == events
