"""The simulated server process in parts: `options`, `ranks`, `startup`, `serving` and `api`; the entry
point that puts them together is `autotune.sim.sglang_server`."""
