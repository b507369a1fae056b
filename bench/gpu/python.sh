# Sourced by the GPU scripts (bench/gpu_check.sh, bench/gpu/distill.sh) from the repository root:
# `pick_python NAME` sets PY to $PYTHON, else the project's .venv, else python3; one without torch is an
# error (exit 1, naming the script).
pick_python() {
    if [[ -n "${PYTHON:-}" ]]; then PY=$PYTHON
    elif [[ -x .venv/bin/python ]]; then PY=.venv/bin/python
    else PY=$(command -v python3 || command -v python); fi
    if ! "$PY" -c "import torch" 2>/dev/null; then
        echo "$1: $PY cannot import torch; set PYTHON to an interpreter with torch (or run make setup)" >&2
        exit 1
    fi
}
