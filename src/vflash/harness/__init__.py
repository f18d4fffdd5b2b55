"""Correctness matrix, benchmarks and plots built on the public API."""
