"""Lab scripts: GPU experiments and profiling tools, not part of the library.

Run from the repository root, e.g. `PYTHONPATH=src:. python3 -m benchmarks.experiments.ab_trees --help`;
what they share is in `common.py`; finished A/B scripts are in `archive/` (see its README).
Their CPU checks: `python -m pytest benchmarks/experiments/tests` (not part of the library's suite).
"""
