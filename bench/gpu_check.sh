#!/usr/bin/env bash
# The CUDA path on one GPU (sized for an H200, under 8 minutes, no downloads): CUDA vs CPU on random Qwen3 and
# Llama configs (one of Qwen3-8B size), AR decode steps at batch 1/8/32 against the memory-bandwidth bound
# (eager and CUDA graph, bf16), and SSD with target and draft as two processes sharing the GPU.
# Writes $OUT/gpu_check.json (bench/results without $OUT) and prints a table last.
# The interpreter: $PYTHON, else the project's .venv, else python3. One without torch is an error (exit 1);
# with torch but no CUDA device there is nothing to check (exit 0, saying so).
#   bash bench/gpu_check.sh [extra args for bench/gpu_check.py]
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/gpu/python.sh
pick_python gpu_check
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device visible to $PY (torch $("$PY" -c 'import torch; print(torch.__version__)')): nothing to check, exit 0"
    exit 0
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
exec timeout 470 "$PY" bench/gpu_check.py "$@"
