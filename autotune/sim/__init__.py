"""The simulated SGLang node: a real server process driven by a memory and performance model.

`profiles` loads hardware and model profiles, `model` answers what a launch would do (one module per
concern: settings, memory, NCCL, failures, timing), `engine` plays the scheduler forward in model time,
and `sglang_server` is the process that the launcher starts in place of `python -m sglang.launch_server`,
put together from `server` (options, start-up, serving, HTTP API, scheduler ranks).
"""
