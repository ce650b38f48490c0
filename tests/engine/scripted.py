"""A drafting source for engine tests that proposes known trees: drafts built from the true greedy
continuation (so some nodes are accepted), with wrong siblings and wrong tails (so some are not)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Tree:
    tokens: np.ndarray
    parents: np.ndarray
    source: np.ndarray
    score: np.ndarray
    source_names: tuple[str, ...] = ("scripted",)

    def prefix(self, k: int) -> Tree:
        return Tree(self.tokens[:k], self.parents[:k], self.source[:k], self.score[:k], self.source_names)

    def select(self, keep) -> Tree:
        from lookupspec.drafting.base import _select

        tokens, parents, source, score = _select(self, keep)
        return Tree(tokens, parents, source, score, self.source_names)


class ScriptedSession:
    def __init__(self, truth: list[int], context: list[int], shape: str, vocab: int) -> None:
        self.truth = truth  # the plain greedy continuation after the prompt
        self.prompt_len = len(context)
        self.context = list(context)
        self.shape = shape
        self.vocab = vocab
        self.step = 0

    def extend(self, tokens):
        self.context.extend(int(t) for t in tokens)

    def feedback(self, tree, accepted):
        pass

    def propose(self, max_nodes: int, chain_only: bool = False) -> Tree:
        self.step += 1
        done = len(self.context) - self.prompt_len
        nxt = self.truth[done: done + 6]
        wrong = lambda t: (t + 1) % self.vocab  # noqa: E731
        toks: list[int] = []
        pars: list[int] = []
        if self.shape == "none":
            pass
        elif self.shape == "chain" or chain_only:
            # a correct prefix of varying length, then a wrong token
            good = nxt[: self.step % 5]
            toks = [*good, wrong(nxt[len(good)]) if len(good) < len(nxt) else 3]
            pars = list(range(-1, len(toks) - 1))
        else:
            # root has a wrong child first and the right one second; the right one continues with a
            # wrong and a right branch; the right branch goes on correctly for a while
            if len(nxt) >= 4:
                toks = [wrong(nxt[0]), nxt[0], wrong(nxt[1]), nxt[1], nxt[2], wrong(nxt[3]), nxt[3]]
                pars = [-1, -1, 1, 1, 3, 4, 4]
        n = min(len(toks), max_nodes)
        score = np.linspace(0.9, 0.5, max(n, 1))[:n]
        return Tree(np.array(toks[:n], np.int32), np.array(pars[:n], np.int32), np.zeros(n, np.int8), score)


class ScriptedDrafting:
    """``truth``: the plain continuation of the one prompt the test runs, or a dict from each prompt
    (a tuple of ids) to its continuation when a test runs several."""

    def __init__(self, truth: list[int] | dict[tuple[int, ...], list[int]], shape: str, vocab: int) -> None:
        self.truth, self.shape, self.vocab = truth, shape, vocab

    def session(self, context, spec, scope):
        truth = self.truth[tuple(context)] if isinstance(self.truth, dict) else self.truth
        return ScriptedSession(truth, context, self.shape, self.vocab)
