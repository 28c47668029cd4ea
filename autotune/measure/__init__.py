"""Measuring a launch: the benchmark client (or SGLang's bench_serving), workloads, measurement plans
and load searches, the NCCL all-reduce benchmark, and the statistics of repeated measurements."""
