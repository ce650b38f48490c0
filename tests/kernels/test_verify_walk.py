"""The torch twin's two tree walks agree: the vectorised one (one torch op per tree level: what the
twin runs on a GPU) and the host one (Python lists: what it runs on the CPU, where the engine's steps
verify). Random batches of trees of every shape, random acceptance, and the greedy rule's acceptance
(a node equals its parent row's token), with empty requests and requests at ``max_nodes``."""

from __future__ import annotations

import pytest
import torch
from lookupspec.kernels import reference


def _batch(gen: torch.Generator, sizes: list[int], vocab: int) -> tuple[torch.Tensor, ...]:
    tokens, parents = [], []
    for n in sizes:
        for i in range(n):
            shape = int(torch.randint(0, 3, (1,), generator=gen))
            parents.append(-1 if i == 0 or shape == 0 else (i - 1 if shape == 1 else
                                                             int(torch.randint(-1, i, (1,), generator=gen))))
            tokens.append(int(torch.randint(0, vocab, (1,), generator=gen)))
    off = torch.tensor([0, *torch.cumsum(torch.tensor(sizes) + 1, 0).tolist()], dtype=torch.int64)
    rows = int(off[-1])
    row_token = torch.randint(0, vocab, (rows,), generator=gen)
    return (torch.tensor(tokens, dtype=torch.int64), torch.tensor(parents, dtype=torch.int64), off, row_token)


def _same(a: reference.BatchVerifyOutput, b: reference.BatchVerifyOutput) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert torch.equal(x, y), (x, y)


@pytest.mark.parametrize("round_", range(40))
def test_host_walk_equals_vectorised_walk(round_: int) -> None:
    gen = torch.Generator().manual_seed(1000 + round_)
    max_nodes = int(torch.randint(1, 12, (1,), generator=gen))
    batch = int(torch.randint(1, 6, (1,), generator=gen))
    sizes = [int(torch.randint(0, max_nodes + 1, (1,), generator=gen)) for _ in range(batch)]
    sizes[0] = max_nodes  # one request at the limit
    vocab = 3  # few tokens: many nodes match their parent row's token
    tok, par, off, row_token = _batch(gen, sizes, vocab)
    node_off = off - torch.arange(batch + 1)
    nreq = torch.searchsorted(node_off[1:], torch.arange(tok.numel()), right=True)
    # the greedy rule's acceptance, as verify_batch computes it on a GPU
    parent_row = torch.where(par >= 0, par + node_off[nreq] + nreq + 1, off[nreq])
    rule = tok == row_token[parent_row] if tok.numel() else torch.zeros(0, dtype=torch.bool)
    _same(reference._walk(rule, par, off, node_off, row_token, max_nodes),
          reference._walk_host(tok, par, off, row_token, None, max_nodes))
    # any acceptance (rejection sampling decides nodes by a test of their own)
    passed = torch.rand(tok.numel(), generator=gen) < 0.6
    _same(reference._walk(passed, par, off, node_off, row_token, max_nodes),
          reference._walk_host(tok, par, off, row_token, passed, max_nodes))


def test_greedy_verify_on_the_cpu_takes_the_host_walk() -> None:
    """A worked example through ``verify_batch``: root row argmax 5, node 0 (token 5) accepted, its
    row's argmax 7; node 1 (7, child of 0) accepted; node 2 (4, child of 0) not; bonus from node 1's
    row (argmax 2)."""
    logits = torch.full((4, 8), -1.0)
    for row, best in enumerate((5, 7, 2, 1)):
        logits[row, best] = 1.0
    out = reference.verify_batch(logits, torch.tensor([5, 7, 4]), torch.tensor([-1, 0, 0]),
                                 torch.tensor([0, 4]), mode="greedy", max_nodes=3)
    assert out.accepted.tolist() == [[0, 1, -1]]
    assert out.num_accepted.tolist() == [2] and out.next_token.tolist() == [2]
    assert out.recovered.tolist() == [False]


def test_argmax_rows_is_torch_argmax_on_ties_infinities_and_nan():
    """NumPy's argmax (the CPU float32 path) picks what torch.argmax picks: the first maximum, a NaN
    over everything, +inf over finite values, a row of -inf at index 0."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randint(-3, 3, (64, 50), generator=gen).float()  # many ties
    x[1, 10] = x[1, 20] = float("inf")
    x[2, :] = float("-inf")
    x[3, 7] = x[3, 30] = float("nan")
    x[4, 40] = float("nan")
    x[4, 5] = float("inf")
    x[5, :] = 0.0
    x[5, 9] = -0.0
    for rows in (x, x[:1], x[10:20], x[0]):
        got = reference.argmax_rows(rows)
        assert got.dtype == torch.int64 and torch.equal(got, torch.argmax(rows, dim=-1))
    assert reference.argmax_rows(x.double()).tolist() == torch.argmax(x, dim=-1).tolist()  # the torch path
