"""Runnable examples of lookupspec in a pipeline (``python -m lookupspec.examples.rag``)."""
