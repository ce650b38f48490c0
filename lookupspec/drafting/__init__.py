"""Drafters (context, corpus, output lookups; draft model) and the composer.

- ``base.py``: the ``Drafter`` protocol, ``Candidate`` (one source's scored tree), ``DraftTree``.
- ``context.py`` / ``corpus.py`` / ``output.py``: ``ContextLookup``, ``CorpusLookup``,
  ``OutputLookup`` over the stores of ``lookupspec.index`` (shared code in ``lookup_drafter.py``);
  ``scoring.py`` turns counts into scores.
- ``stats.py``: ``AcceptanceStats``, per source and match length, shareable across requests.
- ``composer.py``: ``Composer`` merges every candidate into one draft tree under a budget.
"""

from .base import Candidate, Drafter, DraftTree
from .composer import Composer
from .context import ContextLookup
from .corpus import CorpusLookup
from .lookup_drafter import LookupDrafter
from .output import OutputLookup
from .scoring import PROB_CAP, score_continuations
from .stats import AcceptanceStats

__all__ = [
    "PROB_CAP",
    "AcceptanceStats",
    "Candidate",
    "Composer",
    "ContextLookup",
    "CorpusLookup",
    "DraftTree",
    "Drafter",
    "LookupDrafter",
    "OutputLookup",
    "score_continuations",
]
