"""CPU checks of the lab scripts: `python -m pytest benchmarks/experiments/tests` from the
repository root (PYTHONPATH=src). Not part of the library's suite (pyproject's testpaths is tests/)."""
