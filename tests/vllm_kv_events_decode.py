"""Decode KV event payloads with vLLM 0.33's own classes (run as a subprocess).

    python tests/vllm_kv_events_decode.py PAYLOADS.msgpack > DECODED.json

``PAYLOADS.msgpack`` is a msgpack list of payload frames. vLLM is imported
from its unpacked source with the shared harness's shim
(``benchmarks/vllm_ref/source.py``); the shim replaces ``zmq`` in ``sys.modules``,
which is why this runs in its own process and not inside pytest. For each
payload it prints whether ``msgspec.msgpack.Decoder(type=KVEventBatch)``
accepted it, whether vLLM's encoder gives back the same bytes, and the decoded
batch (event class names and fields; bytes as ``{"hex": ...}``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"hex": value.hex()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def main(path: str) -> None:
    from vllm_ref.source import load_vllm

    load_vllm()
    import msgspec
    from vllm.distributed import kv_events

    payloads = msgspec.msgpack.decode(Path(path).read_bytes())
    decoder = msgspec.msgpack.Decoder(type=kv_events.KVEventBatch)
    encoder = msgspec.msgpack.Encoder()
    out = []
    for payload in payloads:
        batch = decoder.decode(payload)
        events = []
        for ev in batch.events:
            fields = {f: plain(getattr(ev, f)) for f in ev.__struct_fields__}
            events.append({"class": type(ev).__name__, **fields})
        out.append(
            {
                "same_bytes": encoder.encode(batch) == payload,
                "ts": batch.ts,
                "data_parallel_rank": batch.data_parallel_rank,
                "events": events,
            }
        )
    json.dump({"vllm_file": kv_events.__file__, "batches": out}, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
