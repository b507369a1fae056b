#!/usr/bin/env bash
# The default draft distilled on one GPU (sized for an H200, under 8 minutes, no network): the models prepared
# from the installed packages (or the GGUF that $SSD_SMOLLM2_GGUF names), teacher data generated on the device
# (~4 minutes, 4 processes of 512 sequences at once, ~14k tok/s on an H200), training there for the time left, held-out acceptance of the new draft
# against the packaged one. Writes draft.safetensors (+ draft.json provenance), draft_config.json, history.json,
# gpu_distill.json and distill.log to $OUT (bench/results/gpu_distill without $OUT) and prints a table last;
# every training checkpoint re-exports the draft, so a timeout still leaves one. See bench/gpu/distill.py.
# The interpreter: $PYTHON, else the project's .venv, else python3. One without torch is an error (exit 1);
# with torch but no CUDA device there is nothing to do (exit 0, saying so). A stage that failed: exit 1;
# the timeout (--budget + 35 s, 455 s by default, then a kill 10 s later): 124.
# SSD_GPU_DISTILL_SMOKE=1 (or --smoke) runs every stage on the CPU at toy size, in well under a minute.
#   bash bench/gpu/distill.sh [extra args for bench/gpu/distill.py]
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/python.sh
pick_python gpu_distill
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
smoke=${SSD_GPU_DISTILL_SMOKE:-0}
for arg in "$@"; do [[ $arg == --smoke ]] && smoke=1; done
if [[ $smoke == 1 ]]; then
    exec timeout -k 10 300 "$PY" bench/gpu/distill.py --smoke "$@"
fi
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_distill: no CUDA device visible to $PY (torch $("$PY" -c 'import torch; print(torch.__version__)')): nothing to do, exit 0"
    exit 0
fi
budget=420   # the recipe's own default; the timeout follows --budget, 35 s past it
prev=
for arg in "$@"; do [[ $prev == --budget ]] && budget=${arg%.*}; prev=$arg; done
exec timeout -k 10 $((budget + 35)) "$PY" bench/gpu/distill.py "$@"
