#!/usr/bin/env bash
# Issue 16's checks on a lent GPU machine, stage by stage (run through the device tool).
#
#   bash tools/gpu/session.sh STAGE[:SECONDS] [STAGE[:SECONDS] ...]
#
# Stages (each logs to $OUT/<stage>.txt, which comes back; $OUT defaults to ./gpu-out):
#   setup         nvidia-smi and versions; pip-installs .gpu-carry/wheels and hybridkv (-e, no deps)
#   noop          nothing (a call that only carries a part of the GGUF)
#   gguf          joins .gpu-carry/gguf-*/part, checks its SHA-256, converts it to the demo
#                 checkpoint under $HYBRIDKV_CACHE (default /root/hybridkv-cache) with the
#                 carried tokenizer (.gpu-carry/tokenizer)
#   kernels       pytest tests/kernels: the interpreter suite compiled on CUDA
#                 (tests/triton_on_cuda.py) plus the GPU-only cases ($KERNEL_TESTS: other
#                 test paths or node ids instead of tests/kernels)
#   engine-tests  pytest tests/engine (the transformers oracles, Triton backend on CUDA;
#                 $ENGINE_TESTS instead of tests/engine)
#   mamba-ssm-tests  the Mamba kernel tests with the carried mamba-ssm on the path
#                 ($MAMBA_SITE; its Triton kernels as a backend and oracle), the check
#                 that transformers cannot see it left out (on CUDA it can: see prepare.py)
#   triton-cache  packs Triton's compile cache into $OUT/triton-cache.tar.gz.part-* (15 MiB
#                 each, at most 4): copied to .gpu-carry/triton-cache/ here and carried,
#                 `setup` unpacks it, so a later lease does not compile what this one did
#   bench-kernels benchmarks/bench_kernels.py --write (results/kernels-<device>.md), with
#                 mamba-ssm on the path when carried (its SSD scan as the yardstick)
#   bench-mamba2  bench_kernels.py's Mamba2 prefill rows only (1 x 1k, 1 x 4k), mamba-ssm beside
#   bench-tiers   benchmarks/bench_tiers.py: host-tier loads into the GPU against a pinned copy_
#   tune          research/tune_attention.py --write (the attention kernel's launch sweep)
#   tune-mamba    research/tune_mamba_scan.py --write (the chunked Mamba scans' launch sweep;
#                 $TUNE_MAMBA_ARGS adds options, e.g. --budget 170: its default 120 s swept
#                 only Bamba's heads on the 2026-11-27 H100)
#   bench-engine  benchmarks/bench_engine.py --write, bf16 and float32, Triton backend
#   bench-engine-random  bench_engine.py and step_profile.py on Gemma 3 270M's shape with
#                 random weights (no carried GGUF needed), bf16, Triton backend
#   bench-engine-graphs  the same with decode steps replayed from CUDA graphs, and the
#                 batch without and with async scheduling (bench_engine --async-scheduling)
#   bench-graphs  benchmarks/bench_graphs.py --write: every family's decode throughput and
#                 shared-document TTFT, eager and with CUDA graphs, in one process, and
#                 where their bf16 outputs part (near-ties or not)
#   bench-graphs-fp32  the same in float32 (graphs-<device>-fp32.md): do the outputs agree
#                 where rounding cannot part them?
#   step-profile  research/step_profile.py --write: is a decode step launch-bound (CUDA graphs)?
#   decode-attention  research/decode_attention_bytes.py --measure --write: decode attention's
#                 launches at the graphed Gemma 3 270M step timed beside the model's
#                 predictions, then that step profiled with the split-KV fill rule off
#                 (step_profile.py --programs-per-sm 0; bench-engine-graphs profiles it on)
#   divergence    benchmarks/explain_divergence.py --write: the demo in bf16 against
#                 transformers, each differing output explained (near-tie) or not
#
# What to carry and in which calls: tools/gpu/prepare.py. Each stage has its own time
# limit (STAGE:SECONDS, else STAGE_TIMEOUT, default 540) so one hung stage does not eat
# the call. BUDGET (seconds, optional) bounds the whole run, as a device call's timeout
# does: a stage gets at most what is left of it less 10 s, and a stage with under 20 s
# left is skipped (logged), so the call returns with every stage's log.
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu-out}"
PY="${PY:-python3}"
LIMIT="${STAGE_TIMEOUT:-540}"
export HYBRIDKV_CACHE="${HYBRIDKV_CACHE:-/root/hybridkv-cache}"
export MAMBA_SITE="${MAMBA_SITE:-/root/mamba-site}"
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$HOME/.triton/cache}"
XDIST=$("$PY" -c 'import xdist' 2>/dev/null && echo "-n 8")
# The test stages' workers share the machine's 16 cores: 2 CPU threads each. Without
# this, each of the 8 workers ran transformers' float64 CPU oracle on 16 threads, and
# the H100 lease's Jamba oracle tests ran past their 100 s timeout (12 of them; each
# passed in 10 s alone).
pytest_threads() { OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 "$@"; }
mkdir -p "$OUT"

stage_setup() {
    nvidia-smi || echo "nvidia-smi: not available"
    "$PY" -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else "-")'
    "$PY" -c 'import triton, transformers; print("triton", triton.__version__, "transformers", transformers.__version__)'
    if compgen -G ".gpu-carry/wheels/*.whl" >/dev/null; then
        "$PY" -m pip install --no-deps --no-index .gpu-carry/wheels/*.whl
    fi
    "$PY" -m pip install --no-deps --no-build-isolation -e . >/dev/null && echo "hybridkv installed (editable)"
    "$PY" -c 'import hybridkv, pydantic; from hybridkv.kernels import unified_attention; print("import ok: hybridkv", hybridkv.__file__, "pydantic", pydantic.VERSION)'
    if compgen -G ".gpu-carry/mamba/*.whl" >/dev/null; then
        "$PY" -m pip install --no-deps --no-index --target "$MAMBA_SITE" .gpu-carry/mamba/*.whl >/dev/null &&
            echo "mamba-ssm installed apart in $MAMBA_SITE (on the path only where a stage puts it)"
    fi
    if compgen -G ".gpu-carry/triton-cache/triton-cache.tar.gz.part-*" >/dev/null; then
        mkdir -p "$TRITON_CACHE_DIR"
        cat .gpu-carry/triton-cache/triton-cache.tar.gz.part-* | tar xzf - -C "$TRITON_CACHE_DIR" &&
            echo "Triton cache unpacked: $(ls "$TRITON_CACHE_DIR" | wc -l) entries"
    fi
}

stage_triton-cache() {
    local n
    tar czf - -C "$TRITON_CACHE_DIR" . | split -b 15M -d - "$OUT/triton-cache.tar.gz.part-"
    n=$(ls "$OUT"/triton-cache.tar.gz.part-* | wc -l)
    du -ch "$OUT"/triton-cache.tar.gz.part-* | tail -1
    if [ "$n" -gt 4 ]; then
        echo "the cache takes $n parts of 15 MiB: more than a call brings back; not kept"
        rm -f "$OUT"/triton-cache.tar.gz.part-*
        return 1
    fi
}

stage_noop() {
    ls -la .gpu-carry 2>/dev/null || echo "no .gpu-carry"
}

stage_gguf() {
    local name want got tok
    read -r want name < .gpu-carry/gguf-1/SHA256
    mkdir -p "$HYBRIDKV_CACHE"
    cat $(ls -d .gpu-carry/gguf-*/part | sort -t- -k3 -n) > "$HYBRIDKV_CACHE/$name"
    got=$(sha256sum "$HYBRIDKV_CACHE/$name" | cut -d' ' -f1)
    [ "$got" = "$want" ] || { echo "SHA-256 mismatch: $got, want $want"; return 1; }
    # The tokenizer converted by prepare.py (transformers 5.17 converts GGUF tokenizers wrongly).
    tok="$HYBRIDKV_CACHE/tokenizer"
    rm -rf "$tok" && mkdir -p "$tok" && cp .gpu-carry/tokenizer/*.json "$tok/"
    gunzip -c .gpu-carry/tokenizer/tokenizer.json.gz > "$tok/tokenizer.json"
    "$PY" -c "
import sys
from pathlib import Path
from hybridkv.models.demo_checkpoint import DEMO_NAME, demo_checkpoint
from hybridkv.models.gguf import convert_gguf
root = Path(sys.argv[1])
convert_gguf(root / sys.argv[2], root / DEMO_NAME, tokenizer_dir=sys.argv[3])
print('demo checkpoint:', demo_checkpoint())
" "$HYBRIDKV_CACHE" "$name" "$tok"
}

# pytest-xdist (in the device image) spreads Triton's compiles over the machine's cores.
stage_kernels() {
    pytest_threads "$PY" -m pytest ${KERNEL_TESTS:-tests/kernels} $XDIST -v -p no:cacheprovider -rfEs --junitxml="$OUT/kernels.xml"
}

stage_engine-tests() {
    pytest_threads "$PY" -m pytest ${ENGINE_TESTS:-tests/engine} $XDIST -v -p no:cacheprovider -rfEs --junitxml="$OUT/engine.xml"
}

# mamba-ssm, where setup installed it, for this stage's Python only.
with_mamba() {
    if [ -d "$MAMBA_SITE/mamba_ssm" ]; then
        PYTHONPATH="$MAMBA_SITE${PYTHONPATH:+:$PYTHONPATH}" "$@"
    else
        "$@"
    fi
}

stage_mamba-ssm-tests() {
    [ -d "$MAMBA_SITE/mamba_ssm" ] || { echo "mamba-ssm not carried (.gpu-carry/mamba)"; return 1; }
    pytest_threads with_mamba "$PY" -m pytest tests/kernels/test_mamba_compat.py tests/kernels/test_mamba_ssm.py \
        tests/kernels/test_mamba_ssm_chunked.py tests/kernels/test_mamba_ssd_chunked.py \
        -k "not test_loader_leaves_mamba_ssm_unimportable" $XDIST -v -p no:cacheprovider -rfEs \
        --junitxml="$OUT/mamba-ssm.xml"
}

stage_bench-kernels() {
    with_mamba "$PY" benchmarks/bench_kernels.py --write
}

stage_tune() {
    "$PY" research/tune_attention.py --write
}

stage_tune-mamba() {
    # shellcheck disable=SC2086  # TUNE_MAMBA_ARGS: options, split on purpose
    with_mamba "$PY" research/tune_mamba_scan.py --write ${TUNE_MAMBA_ARGS:-}
}

stage_bench-engine() {
    "$PY" benchmarks/bench_engine.py --dtype bfloat16 --kernel-backend triton --write &&
        "$PY" benchmarks/bench_engine.py --dtype float32 --kernel-backend triton --write
}

# The demo's shape with random weights (benchmarks/random_checkpoint.py): what a lease
# without the carried GGUF can time. Results say "random weights" and end in -random.md.
stage_bench-engine-random() {
    "$PY" benchmarks/bench_engine.py --random-weights gemma-3-270m --dtype bfloat16 \
        --kernel-backend triton --write &&
        "$PY" research/step_profile.py --random-weights gemma-3-270m --kernel-backend triton \
            --write
}

# The same with decode steps replayed from CUDA graphs (LLM(cuda_graphs=True)), and case
# 1's batch again without and with async scheduling on the same engine (a few seconds).
stage_bench-engine-graphs() {
    "$PY" benchmarks/bench_engine.py --random-weights gemma-3-270m --dtype bfloat16 \
        --kernel-backend triton --cuda-graphs --async-scheduling --write &&
        "$PY" research/step_profile.py --random-weights gemma-3-270m --kernel-backend triton \
            --cuda-graphs --write
}

# The tiers' bandwidth (issue 45/47): host-tier loads into device tensors against a
# pinned host-to-device copy_, and stores from them (store_parts: one event a batch)
# against a pinned device-to-host copy_, in the same process, besides the CPU cases.
stage_bench-tiers() {
    "$PY" benchmarks/bench_tiers.py --sizes 256KiB,4MiB,32MiB --repeats 3 \
        --out "benchmarks/results/tiers-$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-' | tr -cd 'A-Za-z0-9-')".md
}

# Only the Mamba2 prefill rows of bench_kernels.py (1 x 1k and 1 x 4k, both head shapes:
# ours at each chunk size and mamba-ssm, as one call and in a graph): a short call's check.
stage_bench-mamba2() {
    with_mamba "$PY" -c "import sys, torch; sys.path.insert(0, 'benchmarks'); import bench_kernels as b
print(chr(10).join(b.mamba2_prefill_rows(torch.device('cuda'), True)))"
}

stage_bench-graphs() {
    "$PY" benchmarks/bench_graphs.py --write
}

stage_bench-graphs-fp32() {
    "$PY" benchmarks/bench_graphs.py --dtype float32 --write
}

stage_step-profile() {
    "$PY" research/step_profile.py --kernel-backend triton --write
}

# Issue 47: decode attention was 46 % of the graphed step's GPU time at 7.7x its bytes.
stage_decode-attention() {
    "$PY" research/decode_attention_bytes.py --measure --write &&
        "$PY" research/step_profile.py --random-weights gemma-3-270m --kernel-backend triton \
            --cuda-graphs --programs-per-sm 0 --write
}

stage_divergence() {
    "$PY" benchmarks/explain_divergence.py --dtype bfloat16 --kernel-backend triton --write
}

for arg in "$@"; do
    stage="${arg%%:*}"
    if ! declare -F "stage_$stage" >/dev/null; then
        echo "unknown stage: $stage (see the header of $0)" >&2
        exit 2
    fi
    if [ "$arg" != "$stage" ] && ! [[ "${arg#*:}" =~ ^[1-9][0-9]*$ ]]; then
        echo "bad time limit in $arg: STAGE:SECONDS, seconds a positive integer" >&2
        exit 2
    fi
done

status=0
for arg in "$@"; do
    stage="${arg%%:*}"
    limit=$LIMIT
    [ "$arg" != "$stage" ] && limit="${arg#*:}"
    if [ -n "${BUDGET:-}" ]; then
        left=$((BUDGET - SECONDS - 10))
        if [ $left -lt 20 ]; then
            echo "== $stage: skipped, ${left} s of the budget left" | tee -a "$OUT/skipped.txt"
            status=124
            continue
        fi
        [ $left -lt "$limit" ] && limit=$left
    fi
    echo "== $stage" >"$OUT/$stage.txt"
    start=$SECONDS
    touch "$OUT/.stamp"
    # Stage functions run in a child shell so that `timeout` can stop them.
    export -f "stage_$stage" with_mamba pytest_threads
    export PY OUT XDIST KERNEL_TESTS ENGINE_TESTS
    # SIGINT first: pytest then prints its summary (the failures so far) and the junit xml.
    timeout -s INT -k 20 "$limit" bash -c "stage_$stage" >>"$OUT/$stage.txt" 2>&1
    rc=$?
    echo "== $stage: exit $rc in $((SECONDS - start)) s" | tee -a "$OUT/$stage.txt"
    tail -n 25 "$OUT/$stage.txt"
    # What the stage wrote into benchmarks/results/ (a --write), and only that.
    find benchmarks/results -maxdepth 1 -type f -newer "$OUT/.stamp" -exec cp {} "$OUT/" \;
    [ $rc -eq 0 ] || status=$rc
done
rm -f "$OUT/.stamp"

# The device tool brings back at most 8 files from $OUT: past that, everything goes
# into one archive (the third lease lost its Mamba sweep's table to this limit).
if [ "$(find "$OUT" -maxdepth 1 -type f | wc -l)" -gt 8 ]; then
    tar czf /tmp/gpu-out.tar.gz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/gpu-out.tar.gz "$OUT/out.tar.gz"
    echo "more than 8 result files: all of them are in \$OUT/out.tar.gz"
fi
exit $status
