"""The benchmarks the `ssd bench` command runs.

`stack` (`ssd bench`): AR, SD and SSD through one real stack of processes, at several batch sizes, into
bench/results/ssd.json. `serve` (`ssd bench serve`, also `python -m ssd.bench.serve`): a load benchmark of any
OpenAI-compatible endpoint (TTFT, TPOT, ITL, E2E, goodput), with its inputs in `workload` and its figures in
`report`. `locustfile` is the locust suite (`ssd bench locust`: sustained gRPC and OpenAI HTTP load, measured as
`serve` measures). The scripts under bench/ at the repository root are the other, standalone benchmarks.
"""
