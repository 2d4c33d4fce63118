"""Store-tier puts and gets: the copying path against registered staging memory (zero-copy).

One process, one loopback ``mooncake_master`` (started here), one client: for
each unit size (``--sizes``), ``--units`` units (each two parts, K and V, taken
as views of one "pool" array, as the engine's pool rows are) are written with
``MooncakeTier.store_many`` and read back with ``load_many`` into a second
pool array, by a tier with ``zero_copy=False`` (the copying path: a private
``bytearray`` per unit, ``get_batch`` into ``bytes``) and one with
``zero_copy=True`` (``store_io.StagedIO``). The two alternate within each of
``--repeats`` rounds; each round's objects are removed after it. Per path:
MB/s of unit bytes (wall time of the whole batch, until every transfer
settled) and CPU time per unit (``time.process_time``: every thread of this
process, the Mooncake client's included; the master is another process),
medians over the rounds. The bytes read back are checked against the source.

Where the objects live: with ``--remote`` (the default) this process lends the
store only the smallest segment (16 MiB) and a second process (another
replica) lends one that holds the rounds, so most objects cross the loopback
TCP transport between two transfer engines, as between replicas; with
``--local`` this process lends the whole pool, and the client copies into its
own segment in memory (no socket): a replica reading what it wrote itself.

Default sizes: Gemma 3 270M (the demo), one KV cache group of 3 layers, K+V,
1 KV head x 256 dims, bf16: 48 KiB per 16-token block; 1.5 MiB per 512 tokens.

    python benchmarks/bench_store_copy.py [--sizes 48KiB,1536KiB] [--units 64]
        [--repeats 7] [--out benchmarks/results/store-copy.md]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_info import cpu_features, machine

from hybridkv.common.units import format_bytes
from hybridkv.report.units import parse_memory
from hybridkv.tiers import ModelFingerprint, MooncakeTier, UnitKey
from hybridkv.tiers.store_client import StoreClient
from hybridkv.tiers.store_master import MooncakeMaster
from hybridkv.tiers.store_url import parse_store_url

PATHS = (("copying (zerocopy=0)", False), ("zero-copy (zerocopy=1)", True))
#: The other replica: joins the store lending ``segment`` bytes, leaves when stdin closes.
LENDER = """
import sys
from hybridkv.tiers.store_client import StoreClient
from hybridkv.tiers.store_url import parse_store_url
client = StoreClient.connect(parse_store_url(sys.argv[1]))
print("joined", flush=True)
sys.stdin.read()
client.close()
"""


def timed(run: Callable[[], None]) -> tuple[float, float]:
    """Wall and CPU seconds of ``run``."""
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def one_round(
    tier: MooncakeTier, src: np.ndarray, dst: np.ndarray, tag: int
) -> tuple[float, float, float, float]:
    """Put then get every unit once: (put wall, put cpu, get wall, get cpu)."""
    n, size = src.shape
    half = size // 2
    keys = [UnitKey(f"{tag}-{i}".encode().ljust(32, b"."), 0) for i in range(n)]
    items = [(k, [src[i, :half], src[i, half:]], None) for i, k in enumerate(keys)]
    dst[:] = 0

    def put() -> None:
        assert all(t.wait() for t in tier.store_many(items)), "a put failed"

    def get() -> None:
        loads = tier.load_many([(k, [dst[i, :half], dst[i, half:]]) for i, k in enumerate(keys)])
        assert all(t is not None and t.wait() for t in loads), "a get failed"

    pw, pc = timed(put)
    gw, gc = timed(get)
    assert np.array_equal(src, dst), "the bytes read back differ"
    for k in keys:
        tier.client.remove(tier.name(k), force=True)
    return pw, pc, gw, gc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="48KiB,1536KiB")
    ap.add_argument("--units", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--local", action="store_true", help="objects in this process's segment")
    args = ap.parse_args()
    sizes = [parse_memory(s) for s in args.sizes.split(",")]
    biggest = max(sizes) * args.units
    fp = ModelFingerprint("bench", "bench-layout", ("bfloat16",), 16, ("bench-group",))
    rows = []
    with MooncakeMaster(lease_ms=5000) as master:
        pool = max(256 << 20, 4 * biggest)
        lender = None
        if not args.local:
            lender = subprocess.Popen(
                [sys.executable, "-c", LENDER, f"{master.url}&segment={pool}"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
            assert lender.stdout is not None and lender.stdout.readline().strip() == b"joined"
        url = parse_store_url(
            f"{master.url}&segment={16 << 20 if lender else pool}&buffer={2 * biggest}"
            f"&queue={2 * biggest}&staging={2 * biggest}"
        )
        client = StoreClient.connect(url)
        tiers = {
            zc: MooncakeTier(fp, client, url.queue, owns_client=False, zero_copy=zc)
            for _, zc in PATHS
        }
        try:
            for size in sizes:
                rng = np.random.default_rng(size)
                src = rng.integers(0, 256, (args.units, size), dtype=np.uint8)
                dst = np.zeros_like(src)
                runs: dict[bool, list[tuple[float, float, float, float]]] = {
                    zc: [] for _, zc in PATHS
                }
                for r in range(args.repeats + 1):  # round 0 warms up (page faults), not counted
                    for _, zc in PATHS:
                        result = one_round(tiers[zc], src, dst, tag=r * 2 + zc)
                        if r:
                            runs[zc].append(result)
                total = src.nbytes
                for name, zc in PATHS:
                    pw, pc, gw, gc = (statistics.median(x[j] for x in runs[zc]) for j in range(4))
                    rows.append(
                        (
                            size,
                            name,
                            total / pw / 1e6,
                            pc / args.units * 1e6,
                            total / gw / 1e6,
                            gc / args.units * 1e6,
                        )
                    )
        finally:
            for t in tiers.values():
                t.close()
            client.close()
            if lender is not None:
                lender.communicate(timeout=60)
    lines = [
        f"Machine: {machine()}; {cpu_features()}",
        f"{args.units} units per batch, medians of {args.repeats} rounds, loopback master, tcp, "
        + (
            "objects in this process's own segment"
            if args.local
            else "objects mostly in another process's segment (16 MiB lent here)"
        ),
        "",
        "| unit | path | put MB/s | put CPU us/unit | get MB/s | get CPU us/unit |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for size, name, pm, pc, gm, gc in rows:
        lines.append(
            f"| {format_bytes(size)} | {name} | {pm:.0f} | {pc:.0f} | {gm:.0f} | {gc:.0f} |"
        )
    lines.append("")
    for i in range(0, len(rows), 2):
        (size, _, pm0, pc0, gm0, gc0), (_, _, pm1, pc1, gm1, gc1) = rows[i], rows[i + 1]
        lines.append(
            f"{format_bytes(size)}: zero-copy / copying: put {pm1 / pm0:.2f}x MB/s, "
            f"{pc1 / pc0:.2f}x CPU; get {gm1 / gm0:.2f}x MB/s, {gc1 / gc0:.2f}x CPU"
        )
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
