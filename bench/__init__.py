"""ptxdsl's benchmarks: `python -m bench <workload>` measures one workload against its
references, `python -m bench all --out BENCHMARKS.md` regenerates the results page, and
`python -m bench gpu-tests --out GPU_RUNS.md` records a run of the GPU tests. Shared
machinery (timing, twins, checks, the page) is in bench/common.py; references in
bench/refs.py; the profiling scripts are `python -m bench.profile_<what>`."""
