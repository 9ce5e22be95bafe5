"""Tools around the server: nothing in the serving path imports this package.

``bench`` (the benchmark harness, ``rtserver bench``), ``layouts`` (checkpoint
writers in upstream layouts with random weights, for tests and benchmarks),
``measure`` (measurements behind the numbers in docs and code comments) and
``selfcheck`` (GPU self-checks run by hand on a real checkpoint).
"""
