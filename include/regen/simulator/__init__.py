"""A local server that speaks SGLang's native protocol: the demo's backend, the tests' fixture, the benchmarks' load."""
