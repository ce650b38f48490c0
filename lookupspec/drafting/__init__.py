"""Drafters (context, corpus, output lookups; draft model) and the composer."""
