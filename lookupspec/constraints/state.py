"""One sequence's grammar state, walked along the paths of a draft tree.

Words as in ``lookupspec.verify``. The state always sits at the *root* between steps: the prompt's
end plus every emitted token. A step asks :meth:`GrammarState.walk` for the tree it will verify:

- depth first from the root, each node's token is checked against its parent's allowed-token mask;
  a node the grammar forbids is *pruned* with its whole subtree (it is never verified, so it costs no
  row of the forward);
- a kept node is consumed, its own mask computed (it is the mask of the row that predicts the node's
  children and the bonus token after it), its children visited, then rolled back;
- an end token ends its path: it is kept when allowed, never consumed and its children are pruned
  (nothing follows an end token).

Worked example, a grammar for ``"a" | "ab"`` and tokens a=1, b=2, c=3, end=0: the tree
``tokens = [1, 3, 2]``, ``parents = [-1, 0, 0]`` keeps nodes 0 and 2 (``3`` is not allowed after
``a``), so the verified tree is ``[1, 2]``, ``[-1, 0]`` with masks: root {a}, after ``a`` {b, end},
after ``ab`` {end}.

*Grammar drafts* (``jump`` > 0, speculation on): where the grammar forces the text that comes next
(an object's next key with its quotes, colon and comma, under a strict schema), the walk first
drafts that text as a chain from the root, in the tokenizer's own tokens: ``, "due_date": "``
becomes ``,`` `` "`` ``due`` ``_`` ``date`` ``":`` `` "``. The drafters' tree is grafted onto the
chain: its nodes that spell the chain's tokens merge into it, their children hang below, the rest
stay siblings (and are pruned if the grammar forbids them). They are drafts like any other: the
target verifies them, so the output does not change; they are almost always accepted, because the
grammar leaves the target no other text there, only other ways to cut it into tokens.

After verification the caller commits the emitted tokens (:meth:`GrammarState.commit`), which
moves the root.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from lookupspec.constraints.grammar import Grammar

__all__ = ["GrammarState", "TreeMasks", "apply_bitmask", "bitmask_width", "graft"]


def bitmask_width(vocab_size: int) -> int:
    """int32 words of one row's allowed-token bitmask (bit ``t % 32`` of word ``t // 32``)."""
    return (vocab_size + 31) // 32


@dataclass(frozen=True)
class TreeMasks:
    """What :meth:`GrammarState.walk` found: the tree to verify and its masks. ``tokens``, ``parents``:
    [m] the verified tree (parents[i] < i, -1 = the root); ``kept``: [m] each verified node's index in
    the draft tree given to the walk, ascending where the walk drafted nothing itself, -1 for a node
    the grammar drafted; ``masks``: [m + 1, words] int32 bitmasks, row 0 the root's, row ``i + 1``
    verified node ``i``'s; ``dead``: per row, no token at all is allowed there (the grammar dead-ends
    on that path)."""

    kept: tuple[int, ...]
    masks: torch.Tensor  # [m + 1, words] int32, CPU
    dead: tuple[bool, ...]
    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()

    @property
    def drafted(self) -> int:
        """Verified nodes the grammar drafted (no drafter proposed them)."""
        return sum(k < 0 for k in self.kept)


class GrammarState:
    """The grammar state of one sequence (an ``xgrammar.GrammarMatcher`` at the root)."""

    def __init__(self, grammar: Grammar) -> None:
        import xgrammar

        self.grammar = grammar
        self.words = bitmask_width(grammar.vocab_size)
        self._matcher = xgrammar.GrammarMatcher(grammar.compiled)

    @property
    def completed(self) -> bool:
        """The grammar has accepted an end token: nothing more may follow."""
        return bool(self._matcher.is_terminated())

    def jump_tokens(self, limit: int) -> list[int]:
        """At most ``limit`` tokens of the text the grammar forces from the root (none where the next
        character is free), as the grammar's tokenizer writes that text."""
        if limit <= 0 or self.grammar.encode is None or self._matcher.is_terminated():
            return []
        text = self._matcher.find_jump_forward_string()
        return self.grammar.encode(text)[:limit] if text else []

    def walk(self, tokens: Sequence[int], parents: Sequence[int], end_token_ids: Collection[int],
             jump: int = 0) -> TreeMasks:
        """Prune the draft tree (``tokens``, ``parents``: [n], parents[i] < i, -1 = the root) to the
        nodes the grammar allows along their paths, after grafting it onto the grammar's own draft of
        at most ``jump`` tokens (see the module docstring), and give every kept row's mask. The state
        is at the root again afterwards."""
        forced = self.jump_tokens(jump)
        origin: Sequence[int] = range(len(tokens))
        if forced:
            tokens, parents, origin = graft(forced, tokens, parents)
        n = len(tokens)
        children: list[list[int]] = [[] for _ in range(n + 1)]  # children[p + 1]
        for i, p in enumerate(parents):
            children[p + 1].append(i)
        masks = np.zeros((n + 1, self.words), dtype=np.int32)  # by original row (0 = root)
        keep = np.zeros(n, dtype=bool)
        self._fill(masks, 0)
        # explicit stack: (row, child list index); rows are original node index + 1
        stack: list[tuple[int, int]] = [(0, 0)]
        while stack:
            row, k = stack.pop()
            kids = children[row]
            if k >= len(kids):
                if row:
                    self._matcher.rollback(1)
                continue
            stack.append((row, k + 1))
            node = kids[k]
            tok = int(tokens[node])
            if not _allowed(masks[row], tok):
                continue  # pruned with its subtree
            keep[node] = True
            if tok in end_token_ids:
                masks[node + 1] = -1  # a leaf whose row is never used: nothing is emitted after an end
                continue
            if not self._matcher.accept_token(tok):  # pragma: no cover - the mask allowed it
                keep[node] = False
                continue
            self._fill(masks, node + 1)
            stack.append((node + 1, 0))
        kept = [int(i) for i in np.flatnonzero(keep)]
        rows = [0, *[i + 1 for i in kept]]
        out = masks[rows]
        dead = tuple(not bool(r.any()) for r in out)
        where = {old: new for new, old in enumerate(kept)}
        return TreeMasks(tuple(origin[i] for i in kept), torch.from_numpy(out), dead,
                         tuple(int(tokens[i]) for i in kept),
                         tuple(-1 if parents[i] < 0 else where[parents[i]] for i in kept))

    def _fill(self, masks: np.ndarray, row: int) -> None:
        view = torch.from_numpy(masks)  # shares memory: xgrammar writes the row in place
        self._matcher.fill_next_token_bitmask(view, row)
        if self.grammar.allowed_anywhere is not None:
            masks[row] &= self.grammar.allowed_anywhere

    def commit(self, tokens: Sequence[int]) -> int:
        """Move the root over emitted tokens; returns how many it took: fewer than given only where
        no token was allowed (a dead end, or ``min_tokens`` refusing the end of a completed output)
        and the target's choice among refused tokens was not the grammar's."""
        for j, t in enumerate(tokens):
            if self._matcher.is_terminated() or not self._matcher.accept_token(int(t)):
                return j
        return len(tokens)


def graft(chain: Sequence[int], tokens: Sequence[int],
          parents: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """The tree ``chain`` (a chain from the root) with the tree ``tokens``/``parents`` grafted onto it:
    a node whose parent is the root or a chain node, and whose token is the chain's next token, merges
    into that chain node; every other node is appended below its (merged) parent. Returns the tokens,
    parents and, per node, its index in the grafted tree (-1 for a chain node nothing merged into).
    Example: chain [5, 6], tree [5, 7, 8] with parents [-1, 0, 0] -> tokens [5, 6, 7, 8], parents
    [-1, 0, 0, 0], origins [0, -1, 1, 2]."""
    k = len(chain)
    out_tokens, out_parents, origin = list(chain), list(range(-1, k - 1)), [-1] * k
    where: list[int] = []  # tree node -> its index in the result
    for i, (tok, par) in enumerate(zip(tokens, parents, strict=True)):
        p = -1 if par < 0 else where[par]
        if p < k - 1 and int(tok) == chain[p + 1] and origin[p + 1] < 0:  # spells the chain's next token
            origin[p + 1] = i
            where.append(p + 1)
            continue
        out_tokens.append(int(tok))
        out_parents.append(p)
        origin.append(i)
        where.append(len(out_tokens) - 1)
    return out_tokens, out_parents, origin


def _allowed(mask_row: np.ndarray, token: int) -> bool:
    return 0 <= token < mask_row.shape[0] * 32 and bool((int(mask_row[token >> 5]) >> (token & 31)) & 1)


# What a refused token's logit becomes: the most negative float32 (added, so allowed logits keep
# their bits). Not -inf: writing -inf through a boolean mask (masked_fill, np.copyto) measured ~10x
# slower than one multiply-add on a 49k vocabulary, and the most negative float loses every argmax,
# gets probability 0 in every softmax and stays the lowest under temperature and Gumbel noise.
REFUSED = float(torch.finfo(torch.float32).min)


def apply_bitmask(logits: torch.Tensor, masks: torch.Tensor) -> None:
    """Push every token a row's bitmask does not allow down to :data:`REFUSED`, in place.
    logits: [n, vocab] float32 (any device); masks: [n, words] int32 on the CPU (where
    :meth:`GrammarState.walk` makes them). Bits are little-endian words: bit ``t % 8`` of byte
    ``t // 8`` is token ``t``."""
    if logits.dim() != 2 or masks.dim() != 2 or masks.shape[0] != logits.shape[0]:
        raise ValueError(f"logits [n, vocab] and masks [n, words] must agree, got {tuple(logits.shape)} "
                         f"and {tuple(masks.shape)}")
    if masks.dtype != torch.int32 or masks.shape[1] * 32 < logits.shape[1] or masks.device.type != "cpu":
        raise ValueError(f"masks must be CPU int32 with at least vocab / 32 words, got {masks.dtype} "
                         f"{tuple(masks.shape)} on {masks.device}")
    if logits.dtype != torch.float32:
        raise ValueError(f"logits must be float32, got {logits.dtype}")
    words = np.ascontiguousarray(masks.numpy()).astype("<i4", copy=False)
    bits = np.unpackbits(words.view(np.uint8), axis=1, count=logits.shape[1], bitorder="little")
    # the bias in NumPy, one torch op: small torch ops wait on the intra-op thread pool, which is
    # what a busy machine makes slow
    bias = (bits.astype(np.float32) - np.float32(1.0)) * np.float32(-REFUSED)
    logits.add_(torch.from_numpy(bias).to(logits.device, non_blocking=True))  # + 0 allowed, + REFUSED not
