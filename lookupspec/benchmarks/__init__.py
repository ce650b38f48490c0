"""Benchmark commands (`lookupspec bench*`)."""
