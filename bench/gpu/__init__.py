"""The parts of bench/gpu_check.py (the one-GPU check of the CUDA path): `models`, `correctness`, `decode`,
`spec` and `two_process`. Imported as `bench.gpu.*` with the repository root on sys.path (gpu_check.py puts it
there), so the draft process it spawns finds `bench.gpu.two_process.draft_process` too. Beside them,
`distill.sh` / `distill.py`: the default draft distilled on one GPU (docs/models.md, "The GPU recipe")."""
