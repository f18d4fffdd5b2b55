"""Lab scripts: GPU experiments and profiling tools, not part of the library.

Run from the repository root, e.g. `PYTHONPATH=src:. python3 -m benchmarks.experiments.ab_trees --help`;
what they share is in `common.py`. They reach the library through its public modules: timers from
`vflash.harness.timing`, the internals they tune and compile through `vflash.harness.lab`.
Their CPU checks: `python -m pytest benchmarks/experiments/tests` (not part of the library's suite).
"""
