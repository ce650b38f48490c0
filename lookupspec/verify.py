"""Acceptance rules for speculative decoding, and the words lookupspec uses for them.

Vocabulary (code, metrics, logs and the README use exactly these words):

- **draft**: a token proposed for a position after the last accepted token, before the target model
  has judged it. Lookup drafts and greedy draft-model drafts are *deterministic*; a draft model that
  samples its chain produces *sampled* drafts (with their draft probabilities ``q``).
- **draft tree**: the drafts of one step as nodes ``(token, parent)``. ``parent == -1`` hangs a node
  under the **root**, the last accepted token (already emitted, not yet seen by the target); every
  parent index is smaller than its child's. A chain is the tree whose node ``i`` has parent ``i - 1``.
  A node at depth ``d`` (the root's children have ``d = 1``) sits at absolute position
  ``root_position + d``.
- **step**: one target forward over the root and the draft tree, then one verification. The logits of
  a step are laid out root first: row 0 is the root (it predicts depth 1), row ``i + 1`` is node ``i``
  (it predicts its children, at position ``root_position + depth(i) + 1``).
- **accepted**: the draft nodes on the path the verifier walks down from the root; ``num_accepted`` of
  them (0 up to the depth of the tree).
- **recovered** token: the token emitted after the accepted path when the last accepted node (or the
  root) has draft children and every one of them was rejected: the target's own choice there.
- **bonus** token: the token emitted after the accepted path when the last accepted node is a leaf of
  the draft tree (or there was no draft at all): the target's choice one position beyond the drafts.
- **acceptance length**: tokens a step emits = accepted + 1 (the recovered or bonus token). Plain
  decoding is the step with an empty draft tree: acceptance length 1, always a bonus token.

Rules. They are implemented once, batched, in ``lookupspec.kernels`` (the torch twins of
``kernels/reference.py``, which run on the CPU, and the Triton kernels, tested equal to them, on CUDA);
:func:`verify_tree` and :func:`verify_rejection` below run them for one request:

- *Greedy*: the target token of a row is ``argmax(logits)`` (first index on ties); a node is accepted
  when it equals its parent row's target token.
- *Sample-and-match* (deterministic drafts, sampling): the target token of a row is
  ``lookupspec.sampling.select_tokens`` at the position the row predicts, i.e. the token plain seeded
  sampling would emit there; accept the child equal to it. Exact for chains and trees, and per seed:
  speculation on or off gives the same tokens.
- *Rejection sampling* (sampled draft-model chains): accept node ``i`` with probability
  ``min(1, p(x) / q(x))`` (``p`` = target probabilities after temperature/top-k/top-p); on the first
  rejection emit a recovered token drawn from ``normalize(max(0, p - q))``; if every node is accepted
  emit a bonus token drawn from ``p`` of the last row. Exact in distribution (not per seed).

Walking a tree: from the root, move to the first child (lowest index) whose token equals the current
row's target token; stop when none does. Worked example, greedy, ``tokens = [5, 7, 9]``,
``parents = [-1, 0, -1]``, row argmaxes ``[5, 8, 4, 1]``: node 0 (token 5) matches the root's 5 and is
accepted; node 1 (7) does not match node 0's 8, so the walk stops with ``accepted = (0,)`` and emits
8 as a *recovered* token: the step emits ``[5, 8]``, acceptance length 2.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import torch

from lookupspec.sampling import SamplingParams, process_logits

__all__ = [
    "NextKind",
    "VerifyResult",
    "check_logits",
    "node_depths",
    "target_probs",
    "to_index",
    "verify_rejection",
    "verify_tree",
]


class NextKind(StrEnum):
    """What the token emitted after the accepted path is."""

    BONUS = "bonus"
    RECOVERED = "recovered"


@dataclass(frozen=True)
class VerifyResult:
    """The outcome of verifying one step of one request."""

    accepted: tuple[int, ...]  # draft node indices on the accepted path, root side first
    next_token: int  # the recovered or bonus token
    next_kind: NextKind

    @property
    def num_accepted(self) -> int:
        return len(self.accepted)

    @property
    def acceptance_length(self) -> int:
        return len(self.accepted) + 1

    def emitted(self, tokens: Sequence[int] | torch.Tensor) -> list[int]:
        """The tokens this step emits: the accepted drafts, then the next token."""
        toks = tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
        return [int(toks[i]) for i in self.accepted] + [self.next_token]


def to_index(x: Sequence[int] | torch.Tensor, name: str) -> torch.Tensor:
    t = torch.as_tensor(x, dtype=torch.int64, device="cpu") if not isinstance(x, torch.Tensor) else x
    if t.dim() != 1 or t.dtype.is_floating_point or t.dtype == torch.bool:
        raise ValueError(f"{name} must be a 1-D integer tensor, got {tuple(t.shape)} {t.dtype}")
    return t.to("cpu", torch.int64)


def node_depths(parents: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """Depth of every node (the root's children have depth 1). parents: [n] -> [n] int64.

    Validates the tree: ``-1 <= parents[i] < i``."""
    par = to_index(parents, "parents").tolist()
    depths: list[int] = []
    for i, p in enumerate(par):
        if not -1 <= p < i:
            raise ValueError(f"parents[{i}] = {p}: a parent must be -1 (the root) or an earlier node")
        depths.append(1 if p < 0 else depths[p] + 1)
    return torch.tensor(depths, dtype=torch.int64)


def check_logits(logits: torch.Tensor, n: int) -> None:
    if logits.dim() != 2 or logits.shape[0] != n + 1:
        raise ValueError(f"logits must be [n + 1, vocab] = [{n + 1}, vocab] (row 0 = the root), "
                         f"got {tuple(logits.shape)}")
    if not logits.dtype.is_floating_point:
        raise ValueError(f"logits must be floating point, got {logits.dtype}")


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The target distribution of each row: ``softmax(process_logits(logits))``, or one-hot at the
    argmax when greedy. logits: [n, vocab] -> [n, vocab] float32."""
    if params.greedy:
        return torch.nn.functional.one_hot(torch.argmax(logits, dim=-1), logits.shape[-1]).float()
    return torch.softmax(process_logits(logits, params), dim=-1)


def verify_tree(
    logits: torch.Tensor,  # [n + 1, vocab]: row 0 = the root, row i + 1 = node i
    tokens: Sequence[int] | torch.Tensor,  # [n] draft token of each node
    parents: Sequence[int] | torch.Tensor,  # [n] parent node index, -1 = child of the root
    params: SamplingParams,  # greedy, or sampling with a concrete seed
    root_position: int,  # absolute position of the root token
) -> VerifyResult:
    """Greedy or sample-and-match verification of one deterministic draft tree (or chain): the
    rules above, run by ``lookupspec.kernels.verify_batch`` for a batch of one request."""
    tok = to_index(tokens, "tokens")
    depths = node_depths(parents)  # validates the tree
    if depths.numel() != tok.numel():
        raise ValueError(f"tokens and parents differ in length: {tok.numel()} vs {depths.numel()}")
    check_logits(logits, tok.numel())
    if not params.greedy and params.seed is None:
        raise ValueError("sampling needs a concrete seed: call SamplingParams.with_seed() first")
    return _verify_one(logits, tok.tolist(), to_index(parents, "parents").tolist(), params, root_position,
                       "greedy" if params.greedy else "match", None)


def verify_rejection(
    logits: torch.Tensor,  # [n + 1, vocab]: row 0 = the root, row i + 1 = draft i
    tokens: Sequence[int] | torch.Tensor,  # [n] sampled draft chain
    draft_probs: torch.Tensor,  # [n, vocab] q: the draft model's distribution each token was drawn from
    params: SamplingParams,  # sampling with a concrete seed (greedy falls back to the greedy rule)
    root_position: int,  # absolute position of the root token
) -> VerifyResult:
    """Rejection sampling of one sampled draft-model chain (exact in distribution), run by
    ``lookupspec.kernels.verify_batch`` for a batch of one request.

    Randomness, all keyed by (seed, position of the token being decided) so that it is reproducible
    and independent of the draft model's own draws (which must use another stream, e.g.
    ``sampling.STREAM_DRAFT``): the acceptance uniform ``u`` comes from ``STREAM_ACCEPT`` and node ``i``
    is accepted iff ``p(x) > 0 and u * q(x) <= p(x)`` (float32), i.e. with probability
    ``min(1, p(x)/q(x))``; the recovered token is the exponential race ``argmax(max(0, p - q) / E)``
    with ``E ~ Exp(1)`` from ``STREAM_RECOVER`` (falling back to ``argmax(p / E)`` in the float corner
    where ``max(0, p - q)`` is all zero); the bonus token is ``select_tokens`` at its position, i.e.
    the plain seeded sample.
    """
    tok = to_index(tokens, "tokens")
    n = tok.numel()
    check_logits(logits, n)
    if draft_probs.shape != (n, logits.shape[1]) or not draft_probs.dtype.is_floating_point:
        raise ValueError(f"draft_probs must be float [n, vocab] = [{n}, {logits.shape[1]}], "
                         f"got {tuple(draft_probs.shape)} {draft_probs.dtype}")
    if params.greedy:  # p is one-hot: min(1, p/q) accepts exactly the argmax and max(0, p - q) recovers it
        return verify_tree(logits, tok, list(range(-1, n - 1)), params, root_position)
    if params.seed is None:
        raise ValueError("sampling needs a concrete seed: call SamplingParams.with_seed() first")
    return _verify_one(logits, tok.tolist(), list(range(-1, n - 1)), params, root_position, "rejection",
                       draft_probs)


def _verify_one(logits: torch.Tensor, tokens: list[int], parents: list[int], params: SamplingParams,
                root_position: int, mode: str, draft_probs: torch.Tensor | None) -> VerifyResult:
    import lookupspec.kernels as kernels  # kernels.verify_inputs imports this module: import at call time

    batch = kernels.pack_requests([(tokens, parents)], [params], [root_position], device=logits.device)
    probs = None if draft_probs is None else draft_probs.to(logits.device)
    return kernels.verify_batch(logits, **batch._asdict(), mode=mode, draft_probs=probs).results()[0]
