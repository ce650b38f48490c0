"""A plain, per-request implementation of the acceptance rules of ``lookupspec.verify``, kept only as
the tests' independent oracle: the product verifies with ``lookupspec.kernels`` (the torch twins in
``kernels/reference.py`` on the CPU, the Triton kernels on CUDA), and ``lookupspec.verify``'s
per-request functions call those. The kernel tests check the twins and the Triton kernels against
this walk, request by request."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lookupspec.sampling import (
    STREAM_ACCEPT,
    STREAM_RECOVER,
    SamplingParams,
    accept_uniforms,
    exponential_from_keys,
    select_tokens,
    stream_keys,
)
from lookupspec.verify import NextKind, VerifyResult, check_logits, node_depths, target_probs, to_index


def oracle_verify_tree(
    logits: torch.Tensor,  # [n + 1, vocab]: row 0 = the root, row i + 1 = node i
    tokens: Sequence[int] | torch.Tensor,  # [n] draft token of each node
    parents: Sequence[int] | torch.Tensor,  # [n] parent node index, -1 = child of the root
    params: SamplingParams,  # greedy, or sampling with a concrete seed
    root_position: int,  # absolute position of the root token
) -> VerifyResult:
    """Greedy or sample-and-match verification of a deterministic draft tree (or chain)."""
    tok = to_index(tokens, "tokens")
    depths = node_depths(parents)
    n = tok.numel()
    if depths.numel() != n:
        raise ValueError(f"tokens and parents differ in length: {n} vs {depths.numel()}")
    check_logits(logits, n)
    # row 0 predicts root_position + 1, the row of a node at depth d predicts root_position + d + 1
    positions = root_position + 1 + torch.cat([torch.zeros(1, dtype=torch.int64), depths])
    targets = select_tokens(logits, params, positions.to(logits.device)).tolist()  # [n + 1]

    par = to_index(parents, "parents").tolist()
    toks = tok.tolist()
    children: dict[int, list[int]] = {}
    for i, p in enumerate(par):
        children.setdefault(p, []).append(i)  # in index order: the first match wins
    path: list[int] = []
    cur = -1
    while True:
        want = targets[cur + 1]
        nxt = next((c for c in children.get(cur, ()) if toks[c] == want), None)
        if nxt is None:
            break
        path.append(nxt)
        cur = nxt
    kind = NextKind.RECOVERED if children.get(cur) else NextKind.BONUS
    return VerifyResult(tuple(path), int(targets[cur + 1]), kind)


def oracle_verify_rejection(
    logits: torch.Tensor,  # [n + 1, vocab]: row 0 = the root, row i + 1 = draft i
    tokens: Sequence[int] | torch.Tensor,  # [n] sampled draft chain
    draft_probs: torch.Tensor,  # [n, vocab] q: the draft model's distribution each token was drawn from
    params: SamplingParams,  # sampling with a concrete seed (greedy falls back to the greedy rule)
    root_position: int,  # absolute position of the root token
) -> VerifyResult:
    """Rejection sampling of a sampled draft-model chain (exact in distribution).

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
    if params.greedy:
        # p is one-hot: min(1, p/q) accepts exactly the argmax and max(0, p - q) recovers it
        return oracle_verify_tree(logits, tok, list(range(-1, n - 1)), params, root_position)
    if params.seed is None:
        raise ValueError("sampling needs a concrete seed: call SamplingParams.with_seed() first")
    dev = logits.device
    probs = target_probs(logits, params)  # [n + 1, vocab]
    q = draft_probs.to(dev, torch.float32)
    positions = root_position + 1 + torch.arange(n + 1, dtype=torch.int64)  # [n + 1]
    seeds = torch.full((n + 1,), params.seed, dtype=torch.int64)
    tok_d = tok.to(dev)
    rows = torch.arange(n, device=dev)
    u = accept_uniforms(stream_keys(seeds[:n], positions[:n], STREAM_ACCEPT)).to(dev)  # [n]
    px, qx = probs[rows, tok_d], q[rows, tok_d]
    accepted = ((px > 0) & (u * qx <= px)).tolist()
    a = accepted.index(False) if False in accepted else n
    if a == n:
        bonus = select_tokens(logits[n:], params, positions[n:].to(dev))
        return VerifyResult(tuple(range(n)), int(bonus[0]), NextKind.BONUS)
    e = exponential_from_keys(stream_keys(seeds[a:a + 1], positions[a:a + 1], STREAM_RECOVER),
                              logits.shape[1])[0].to(dev)  # [vocab]
    race = torch.clamp(probs[a] - q[a], min=0.0) / e
    if not bool(race.max() > 0):
        race = probs[a] / e
    return VerifyResult(tuple(range(a)), int(torch.argmax(race)), NextKind.RECOVERED)
