"""The tools around the compiler: the command line, the sample runner, compute-sanitizer,
parallel precompilation and the autotuner's selection and cache."""
