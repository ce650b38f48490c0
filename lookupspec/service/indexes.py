"""This replica's lookup indexes, kept equal to the shared store's state, and the per-request scope.

``IndexRegistry`` is a store listener (``lookupspec.store.StateListener``): for every namespace it keeps
one ``CorpusIndex`` per document collection and one ``OutputIndex`` of earlier outputs, updated by the
store's hooks as records are applied (own writes, replay at start-up, other replicas' writes). Drafting
reads only these in-memory indexes, never the store or Redis.

``corpus(namespace, name)`` and ``output(namespace)`` hand a request's planner (``lookupspec.planning``)
the indexes it may draft from, all of its own namespace: that is the isolation rule. A request keeps
the index objects it was given, so a collection deleted while a request runs stays readable by that
request and is gone for later ones.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lookupspec.index import CorpusIndex, OutputIndex

__all__ = ["IndexRegistry"]


@dataclass
class _Namespace:
    corpora: dict[str, CorpusIndex] = field(default_factory=dict)
    output: OutputIndex | None = None


class IndexRegistry:
    """Thread-safe. Hooks are called serialized by the store (never concurrently with each other);
    the index queries run on request threads at the same time."""

    def __init__(self, *, output_cap_tokens: int = 1_000_000) -> None:
        self.output_cap_tokens = output_cap_tokens
        self._lock = threading.Lock()  # guards the dicts; the indexes themselves are thread-safe
        self._namespaces: dict[str, _Namespace] = {}
        CorpusIndex()  # JIT warm-up (numba) now, not on the first request

    def _ns(self, namespace: str) -> _Namespace:
        ns = self._namespaces.get(namespace)
        if ns is None:
            ns = self._namespaces[namespace] = _Namespace()
        return ns

    # ---- store hooks ------------------------------------------------------------------------

    def on_document_added(self, namespace: str, collection: str, doc_id: str, tokens: np.ndarray) -> None:
        """tokens: [num_tokens] int32."""
        with self._lock:
            corpora = self._ns(namespace).corpora
            store = corpora.get(collection)
            if store is None:
                store = corpora[collection] = CorpusIndex()
        store.add_document(doc_id, tokens)

    def on_document_deleted(self, namespace: str, collection: str, doc_id: str) -> None:
        with self._lock:
            ns = self._namespaces.get(namespace)
            store = None if ns is None else ns.corpora.get(collection)
        if store is not None:
            store.delete_document(doc_id)

    def on_collection_deleted(self, namespace: str, collection: str) -> None:
        with self._lock:
            ns = self._namespaces.get(namespace)
            if ns is not None:
                ns.corpora.pop(collection, None)

    def on_output_appended(self, namespace: str, tokens: np.ndarray) -> None:
        """tokens: [num_tokens] int32."""
        with self._lock:
            ns = self._ns(namespace)
            if ns.output is None:
                ns.output = OutputIndex(self.output_cap_tokens)
            store = ns.output
        store.append(tokens)

    # The output index evicts by its own token cap; the log's eviction (a count cap) needs no action:
    # an output the log forgot may stay in the index until the index's own cap pushes it out.

    # ---- requests ---------------------------------------------------------------------------

    def corpus(self, namespace: str, collection: str) -> CorpusIndex | None:
        """The collection's corpus index, None when nothing of it is indexed (the caller checks that
        the collection exists: the store's state is the authority, and a collection whose documents
        were all deleted exists but has no index here)."""
        with self._lock:
            ns = self._namespaces.get(namespace)
            return None if ns is None else ns.corpora.get(collection)

    def output(self, namespace: str) -> OutputIndex | None:
        """The namespace's output index (None until its first output)."""
        with self._lock:
            ns = self._namespaces.get(namespace)
            return None if ns is None else ns.output

    def sizes(self) -> dict[str, Any]:
        """Index sizes for /metrics: tokens and bytes of the corpus and output indexes."""
        with self._lock:
            corpora = [s for ns in self._namespaces.values() for s in ns.corpora.values()]
            outputs = [ns.output for ns in self._namespaces.values() if ns.output is not None]
        return {
            "corpus_stores": len(corpora),
            "corpus_tokens": sum(len(s) for s in corpora),
            "corpus_bytes": sum(s.memory_bytes() for s in corpora),
            "output_stores": len(outputs),
            "output_tokens": sum(len(s) for s in outputs),
            "output_bytes": sum(s.memory_bytes() for s in outputs),
        }
