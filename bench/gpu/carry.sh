#!/usr/bin/env bash
# The GPU recipe on an offline machine that takes few files per call (this workplace's device tool: 64 MiB of
# working tree a call, a warm machine kept ~30 s between calls). The target's GGUF (98 MB) goes over as two
# halves of an xz stream in two calls to one warm machine; the target is rebuilt there with gguf-py alone and
# checked bit-identical to `ssd models prepare`'s (bench/gpu/offline_target.py).
#   bash bench/gpu/carry.sh pack            here: writes .gpu/{a,b,w1,w2} (ignored); prints the two calls
#   bash bench/gpu/carry.sh first           device call 1 (carry .gpu/a .gpu/w1): part 1, wheels, the target's
#                                           small files into /root/ssd-carry; then bench/gpu/preflight.py on CUDA
#   bash bench/gpu/carry.sh second [args]   device call 2 (carry .gpu/b .gpu/w2), at once: the GGUF assembled and
#                                           checked, the target decoded and checked, then bench/gpu/distill.sh
#                                           --gguf ... --models-dir ... [args] writing to $OUT
set -uo pipefail
cd "$(dirname "$0")/../.."
STORE=${SSD_CARRY_STORE:-/root/ssd-carry}   # where call 1 leaves what call 2 needs
case "${1:-}" in
pack)
    source bench/gpu/python.sh
    pick_python carry
    G=$("$PY" -c 'from ssd.models.prepare import default_gguf_path; print(default_gguf_path())') || exit 1
    T=$("$PY" -c 'from ssd.models.prepare import prepare_default_models; print(prepare_default_models(log=lambda m: None)["target"])') || exit 1
    rm -rf .gpu && mkdir -p .gpu/a .gpu/b .gpu/w1/target .gpu/w2
    files=$(PYTHONPATH=$PWD "$PY" -c 'from bench.gpu.offline_target import SMALL_FILES; print(*SMALL_FILES)') || exit 1
    for f in $files; do
        cp "$T/$f" .gpu/w1/target/ || exit 1
    done
    "$PY" bench/gpu/offline_target.py --digest "$T" > .gpu/w2/digest || exit 1
    sha256sum "$G" | cut -d' ' -f1 > .gpu/w2/gguf.sha256
    # the machine's python (3.12) has torch, transformers and most of our needs; not these two
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_31_x86_64 --platform manylinux2014_x86_64 -d .gpu/w1 \
        "gguf==$("$PY" -c 'import importlib.metadata as m; print(m.version("gguf"))')" \
        "llguidance==$("$PY" -c 'import importlib.metadata as m; print(m.version("llguidance"))')" || exit 1
    xz -9e -T2 -c "$G" > .gpu/gguf.xz || exit 1
    total=$(stat -c %s .gpu/gguf.xz); w1=$(du -sb .gpu/w1 | cut -f1)
    first=$(( (total - w1) / 2 ))      # both calls carry about as much
    head -c $first .gpu/gguf.xz > .gpu/a/xz.part0 && tail -c +$((first + 1)) .gpu/gguf.xz > .gpu/b/xz.part1 && rm .gpu/gguf.xz
    tree=$(git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {print s}')
    du -sb .gpu/a .gpu/w1 .gpu/b .gpu/w2
    echo "working tree $tree bytes; call 1 carries $((tree + first + w1)), call 2 $((tree + total - first)) (limit 67108864)"
    echo "call 1: run(command='bash bench/gpu/carry.sh first', carry=['.gpu/a', '.gpu/w1'], timeout_s=240)"
    echo "call 2, within the warm window: run(command='bash bench/gpu/carry.sh second --budget 420', carry=['.gpu/b', '.gpu/w2'], timeout_s=600)"
    ;;
first)
    mkdir -p $STORE/target && cp .gpu/a/xz.part0 $STORE/ && cp .gpu/w1/target/* .gpu/w1/target/.ssd-prepared $STORE/target/ || exit 2
    python3 -m pip install -q --no-index --no-deps --no-compile --target $STORE/site .gpu/w1/*.whl || exit 2
    export PYTHONPATH=$STORE/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
    timeout 200 python3 bench/gpu/preflight.py --files $STORE/target --device cuda
    ;;
second)
    shift
    export PYTHONPATH=$STORE/site:$PWD PYTHON=python3
    G=$STORE/SmolLM2-135M-Instruct.Q4_1.gguf
    cat $STORE/xz.part0 .gpu/b/xz.part1 | xz -dc > $G 2>/dev/null \
        || cat $STORE/xz.part0 .gpu/b/xz.part1 | python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)" > $G \
        || { echo "carry: could not assemble the GGUF (was call 1 run on this machine?)"; exit 2; }
    [[ "$(sha256sum $G | cut -d' ' -f1)" == "$(cat .gpu/w2/gguf.sha256)" ]] || { echo "carry: GGUF checksum differs"; exit 2; }
    python3 bench/gpu/offline_target.py $G $STORE/models --files $STORE/target --expect "$(cat .gpu/w2/digest)" || exit 3
    bash bench/gpu/distill.sh --gguf $G --models-dir $STORE/models "$@" 2>&1 | tee "${OUT:-/tmp}/run.log"
    ;;
*)
    sed -n 2,12p "$0"; exit 2 ;;
esac
