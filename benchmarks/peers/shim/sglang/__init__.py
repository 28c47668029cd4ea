"""Stand-ins for the few SGLang modules that SGLang's auto_benchmark imports, so that its own code runs here
without SGLang (which pulls torch and CUDA): datasets of random token ids, no tokenizer, and a
`bench_serving` that measures the simulated server with autotune's client. Used by benchmarks/peers only;
never by the product."""
