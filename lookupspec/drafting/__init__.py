"""Drafters (context, corpus, output lookups; draft model) and the composer.

- ``base.py``: the ``Drafter`` protocol, ``Candidate`` (one source's scored tree), ``DraftTree``.
- ``lookup_drafter.py``: ``LookupDrafter``, one class for the context, corpus and output lookups over
  the stores of ``lookupspec.index`` (the source name is an argument); ``scoring.py`` turns counts
  into scores.
- ``session.py``: ``LookupSession`` (one request's drafters, merged by a composer) and
  ``LookupDrafting`` (engine-wide statistics; makes the sessions).
- ``policy.py``: ``DraftPolicy``, which chooses each step's draft (how much of the lookup tree, or a
  draft-model chain, or nothing) from measured costs and acceptance.
- ``draft_model.py``: the draft-model drafter; ``derived.py``: draft models derived from the target.
- ``stats.py``: ``AcceptanceStats``, per source and match length, shareable across requests.
- ``composer.py``: ``Composer`` merges every candidate into one draft tree under a budget.
"""

from .base import Candidate, Drafter, DraftTree
from .composer import Composer
from .lookup_drafter import LookupDrafter
from .scoring import PROB_CAP, score_continuations
from .stats import AcceptanceStats

__all__ = [
    "PROB_CAP",
    "AcceptanceStats",
    "Candidate",
    "Composer",
    "DraftTree",
    "Drafter",
    "LookupDrafter",
    "score_continuations",
]
