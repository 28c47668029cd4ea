"""The simulated server process in parts: `options`, `ranks`, `launch` (what every part shares), `startup`,
`serving` and `api`; the entry point that puts them together is `autotune.sim.sglang_server`."""
