"""Batch jobs over many documents (``lookupspec summarize``)."""
