"""Benchmarks behind ``minivllm bench ...`` (measured on a GPU, never in timed tests)."""
