"""Benchmarks of relevancy-tracer: one module per measurement, run from the repository root as
``python -m benchmarks.NAME`` (``--help`` lists each one's flags). Results go to
``benchmarks/results/``; docs/benchmarks.md shows the figures with the commands that made them.
Not part of the product: the wheel holds only ``relevancy_tracer``."""
