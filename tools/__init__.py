"""Research tooling for lookupspec's developers: replays, oracles, kernel and index studies.

Not installed with the wheel; run from a checkout as ``python -m tools <command>`` (see
``tools/__main__.py`` for the list). The user-facing benchmarks, ``lookupspec bench`` and
``lookupspec bench-serve``, live in ``lookupspec/benchmarks/``.
"""
