"""Benchmark and lab tooling of the repository (not part of the vflash package).
Run its modules from the repository root: `python3 -m benchmarks.experiments.NAME`."""
