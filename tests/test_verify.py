"""Acceptance rules (lookupspec/verify.py, which runs the batched kernels for one request): greedy and
sample-and-match tree walks on hand-written logits, sample-and-match against plain sequential
sampling, and rejection sampling's losslessness by chi-square tests on a tiny vocabulary.

Statistical tests: each compares observed counts with the target distribution by Pearson's
chi-square and fails when p < ALPHA = 1e-6; zero-probability outcomes must never occur. The samples
are drawn fresh every run (random seed base), so each such test falsely fails with probability
1e-6 and this file's seven with probability < 1e-5.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch_threads import torch_threads

from lookupspec.sampling import (
    STREAM_ACCEPT,
    STREAM_DRAFT,
    STREAM_RECOVER,
    SamplingParams,
    accept_uniforms,
    exponential_from_keys,
    gumbel_from_keys,
    gumbel_noise,
    position_keys,
    process_logits,
    select_tokens,
    stream_keys,
)
from lookupspec.verify import NextKind, VerifyResult, node_depths, target_probs, verify_rejection, verify_tree

ALPHA = 1e-6
GREEDY = SamplingParams()


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with torch_threads(1):
        yield


def rows(argmaxes: list[int], vocab: int = 10) -> torch.Tensor:
    """Logits [len, vocab] whose row i peaks at argmaxes[i]."""
    out = torch.arange(vocab, dtype=torch.float32).flip(0).repeat(len(argmaxes), 1) * 0.01
    for i, a in enumerate(argmaxes):
        out[i, a] = 5.0
    return out


# --- greedy ------------------------------------------------------------------------------------------


def test_result_vocabulary():
    r = VerifyResult((0, 2), 7, NextKind.BONUS)
    assert r.num_accepted == 2 and r.acceptance_length == 3
    assert r.emitted([4, 5, 6]) == [4, 6, 7]
    assert str(NextKind.RECOVERED) == "recovered"


def test_no_draft_is_plain_decoding():
    r = verify_tree(rows([3]), [], [], GREEDY, root_position=9)
    assert r == VerifyResult((), 3, NextKind.BONUS)


def test_chain_all_accepted_ends_with_bonus():
    r = verify_tree(rows([1, 2, 3, 4]), [1, 2, 3], [-1, 0, 1], GREEDY, 0)
    assert r == VerifyResult((0, 1, 2), 4, NextKind.BONUS)
    assert r.emitted([1, 2, 3]) == [1, 2, 3, 4]


def test_chain_partly_accepted_ends_with_recovered():
    r = verify_tree(rows([1, 2, 8, 4]), [1, 2, 3], [-1, 0, 1], GREEDY, 0)
    assert r == VerifyResult((0, 1), 8, NextKind.RECOVERED)


def test_first_draft_rejected():
    r = verify_tree(rows([6, 2, 3]), [1, 2], [-1, 0], GREEDY, 0)
    assert r == VerifyResult((), 6, NextKind.RECOVERED)


def test_docstring_worked_example():
    r = verify_tree(rows([5, 8, 4, 1]), [5, 7, 9], [-1, 0, -1], GREEDY, 0)
    assert r == VerifyResult((0,), 8, NextKind.RECOVERED)
    assert r.emitted([5, 7, 9]) == [5, 8]


def test_tree_follows_the_matching_branch():
    # root -> {0: 4, 1: 6}; 0 -> {2: 1}; 1 -> {3: 2, 4: 7}; 4 -> {5: 9}
    tokens, parents = [4, 6, 1, 2, 7, 9], [-1, -1, 0, 1, 1, 4]
    r = verify_tree(rows([6, 0, 0, 0, 0, 9, 3]), tokens, parents, GREEDY, 0)
    # root wants 6 -> node 1; node 1's row (row 2) wants 0: neither child 2 nor 7 -> recovered 0
    assert r == VerifyResult((1,), 0, NextKind.RECOVERED)
    r = verify_tree(rows([6, 0, 7, 0, 0, 9, 3]), tokens, parents, GREEDY, 0)
    assert r == VerifyResult((1, 4, 5), 3, NextKind.BONUS)


def test_depth_one_tree_wide():
    tokens = list(range(8))
    r = verify_tree(rows([5] + [2] * 8), tokens, [-1] * 8, GREEDY, 0)
    assert r == VerifyResult((5,), 2, NextKind.BONUS)  # node 5 is a leaf
    r = verify_tree(rows([9] + [2] * 8), tokens, [-1] * 8, GREEDY, 0)
    assert r == VerifyResult((), 9, NextKind.RECOVERED)


def test_argmax_ties_take_the_first_index():
    logits = torch.zeros(2, 6)
    logits[0, 2] = logits[0, 4] = 3.0  # tie: the target is token 2
    r = verify_tree(logits, [4], [-1], GREEDY, 0)
    assert r == VerifyResult((), 2, NextKind.RECOVERED)
    r = verify_tree(logits, [2], [-1], GREEDY, 0)
    assert r == VerifyResult((0,), 0, NextKind.BONUS)  # row 1 is all zeros: token 0


def test_duplicate_siblings_first_wins():
    r = verify_tree(rows([3, 1, 2]), [3, 3], [-1, -1], GREEDY, 0)
    assert r.accepted == (0,) and r.next_token == 1


def test_extreme_finite_logits():
    logits = torch.full((3, 5), -3.0e38)
    logits[0, 1] = 3.0e38
    logits[1, 4] = -1.0e38
    r = verify_tree(logits, [1, 4], [-1, 0], GREEDY, 0)
    assert r == VerifyResult((0, 1), 0, NextKind.BONUS)


def test_invalid_trees_are_refused():
    with pytest.raises(ValueError, match="parent"):
        verify_tree(rows([1, 2]), [1], [0], GREEDY, 0)
    with pytest.raises(ValueError, match="logits"):
        verify_tree(rows([1]), [1], [-1], GREEDY, 0)
    with pytest.raises(ValueError, match="seed"):
        verify_tree(rows([1, 2]), [1], [-1], SamplingParams(temperature=1.0), 0)
    assert node_depths([-1, 0, 0, 2, -1]).tolist() == [1, 2, 2, 3, 1]


# --- sample-and-match ----------------------------------------------------------------------------


def _markov(vocab: int, gen: torch.Generator) -> torch.Tensor:
    """A toy target: next-token logits depend on the previous token only. [vocab, vocab]."""
    return torch.randn(vocab, vocab, generator=gen) * 2.0


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=5),
        SamplingParams(temperature=1.3, top_p=0.8),
        SamplingParams(temperature=0.9, top_k=8, top_p=0.9),
        SamplingParams(temperature=0.0),
    ],
    ids=["t1", "topk", "topp", "topk-topp", "greedy"],
)
def test_sample_and_match_equals_sequential_sampling(params: SamplingParams):
    """Whatever trees are drafted, a seeded request emits exactly the plain seeded sample sequence."""
    seed0 = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator().manual_seed(seed0)
    vocab, length = 12, 40
    table = _markov(vocab, gen)
    for trial in range(4):
        p = SamplingParams(params.temperature, params.top_k, params.top_p, seed=seed0 * 10 + trial)
        start = 7 + trial
        plain = [int(torch.randint(vocab, (1,), generator=gen))]
        for pos in range(start + 1, start + length + 1):
            plain.append(int(select_tokens(table[plain[-1]][None], p, torch.tensor([pos]))[0]))
        out = [plain[0]]
        pos = start  # absolute position of the root (the last emitted token)
        while len(out) < len(plain):
            # a random tree; with probability 1/2 a node copies the true continuation of its path
            n = int(torch.randint(0, 9, (1,), generator=gen))
            tokens: list[int] = []
            parents: list[int] = []
            paths: list[list[int]] = []
            for i in range(n):
                par = int(torch.randint(-1, i, (1,), generator=gen)) if i else -1
                prefix = [] if par < 0 else paths[par]
                j = len(out) + len(prefix)
                on_track = j < len(plain) and out + prefix == plain[: len(out) + len(prefix)]
                if on_track and bool(torch.rand(1, generator=gen) < 0.5):
                    tok = plain[j]
                else:
                    tok = int(torch.randint(vocab, (1,), generator=gen))
                tokens.append(tok)
                parents.append(par)
                paths.append([*prefix, tok])
            last = [out[-1]] + [path[-1] for path in paths]
            res = verify_tree(table[last], tokens, parents, p, pos)
            emitted = res.emitted(tokens)
            out += emitted
            pos += len(emitted)
        assert out[: len(plain)] == plain, f"seed base {seed0}, trial {trial}"


# --- rejection sampling -----------------------------------------------------------------------------


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square p-value of counts against probs; outcomes with probability 0 must not occur."""
    counts, probs = counts.double().flatten(), probs.double().flatten()
    zero = probs <= 0
    assert counts[zero].sum() == 0, f"impossible outcomes observed: {counts[zero].tolist()}"
    c, p = counts[~zero], probs[~zero] / probs[~zero].sum()
    expected = p * c.sum()
    # pool the rarest outcomes (ascending) until the pool and every remaining cell expect >= 5
    order = torch.argsort(expected)
    pooled = 0
    while pooled < len(order) and (expected[order[:pooled]].sum() < 5 or expected[order[pooled]] < 5):
        pooled += 1
    if pooled:
        rest = order[pooled:]
        c = torch.cat([c[rest], c[order[:pooled]].sum()[None]])
        expected = torch.cat([expected[rest], expected[order[:pooled]].sum()[None]])
    assert expected.min() >= 5 and c.numel() >= 2, "too few samples for a chi-square test"
    stat = ((c - expected) ** 2 / expected).sum()
    dof = c.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), stat / 2.0))


def _pair(kind: str, vocab: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(target logits [vocab], draft probabilities [vocab]) of an adversarial pair."""
    logits = torch.randn(vocab, generator=gen)
    p = torch.softmax(logits, 0)
    if kind == "identical":
        q = p.clone()
    elif kind == "disjoint":
        logits[3:] = -1.0e4  # target mass on tokens 0-2 only (exp underflows to exactly 0)
        q = torch.zeros(vocab)
        q[3:] = torch.softmax(torch.randn(vocab - 3, generator=gen), 0)
    elif kind == "one_hot":
        q = torch.zeros(vocab)
        q[int(torch.argmax(p))] = 1.0
    elif kind == "near_uniform":
        logits = torch.randn(vocab, generator=gen) * 0.05
        q = torch.softmax(torch.randn(vocab, generator=gen) * 0.05, 0)
    else:
        raise AssertionError(kind)
    return logits, q


KINDS = ["identical", "disjoint", "one_hot", "near_uniform"]
FILTERED = SamplingParams(temperature=0.8, top_k=4, top_p=0.95)


@pytest.mark.parametrize("kind", [*KINDS, "filtered"])
def test_rejection_first_token_has_the_target_distribution(kind: str):
    seed0 = int.from_bytes(os.urandom(5), "little")
    gen = torch.Generator().manual_seed(seed0)
    vocab, samples = 5, 1500
    logits, q = _pair("near_uniform" if kind == "filtered" else kind, vocab, gen)
    params = FILTERED if kind == "filtered" else SamplingParams(temperature=1.0)
    p = target_probs(logits[None], params)[0]
    if kind == "filtered":
        assert (p == 0).sum() >= 1  # top-k cut something
    rows_ = torch.stack([logits, torch.randn(vocab, generator=gen)])  # root row + the draft's row
    drafts = torch.multinomial(q, samples, replacement=True, generator=gen)
    counts = torch.zeros(vocab)
    for s in range(samples):
        sp = SamplingParams(params.temperature, params.top_k, params.top_p, seed=seed0 + s)
        x = int(drafts[s])
        res = verify_rejection(rows_, [x], q[None], sp, root_position=17)
        counts[res.emitted([x])[0]] += 1
    assert chi2_pvalue(counts, p) > ALPHA, (kind, seed0, counts.tolist(), p.tolist())


@pytest.mark.parametrize("kind", ["disjoint", "one_hot"])
def test_rejection_two_token_chain_has_the_target_distribution(kind: str):
    """Generate with 2-token sampled chains until two tokens are out; compare their joint law with
    the target's p(t1) p(t2 | t1) (the target is a Markov table, the draft another)."""
    seed0 = int.from_bytes(os.urandom(5), "little")
    gen = torch.Generator().manual_seed(seed0)
    vocab, samples = 4, 1500
    target = torch.empty(vocab, vocab)
    draft = torch.empty(vocab, vocab)
    for prev in range(vocab):
        target[prev], draft[prev] = _pair(kind, vocab, gen)
    params = SamplingParams(temperature=1.0)
    p = target_probs(target, params)  # [prev, next]
    root = 2
    joint = p[root][:, None] * p  # P(t1, t2) = p(t1 | root) p(t2 | t1)
    counts = torch.zeros(vocab, vocab)
    for s in range(samples):
        sp = SamplingParams(1.0, seed=seed0 + s)
        out, pos = [root], 40
        while len(out) < 3:
            x0 = int(torch.multinomial(draft[out[-1]], 1, generator=gen))
            x1 = int(torch.multinomial(draft[x0], 1, generator=gen))
            res = verify_rejection(target[[out[-1], x0, x1]], [x0, x1], draft[[out[-1], x0]], sp, pos)
            emitted = res.emitted([x0, x1])
            out += emitted
            pos += len(emitted)
        counts[out[1], out[2]] += 1
    assert chi2_pvalue(counts, joint) > ALPHA, (kind, seed0, counts.tolist())


def test_rejection_with_greedy_params_is_the_greedy_rule():
    logits = rows([3, 4, 5])
    q = torch.full((2, 10), 0.1)
    assert verify_rejection(logits, [3, 9], q, GREEDY, 0) == VerifyResult((0,), 4, NextKind.RECOVERED)
    assert verify_rejection(logits, [3, 4], q, GREEDY, 0) == VerifyResult((0, 1), 5, NextKind.BONUS)


def test_rejection_is_reproducible_per_seed_and_keeps_target_support():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 6, generator=gen)
    logits[1:, 0] = -1.0e4  # p(0) = 0 after the root
    q = torch.softmax(torch.randn(3, 6, generator=gen), -1)
    sp = SamplingParams(temperature=1.0, seed=99)
    a = verify_rejection(logits, [0, 0, 0], q, sp, 5)
    assert a == verify_rejection(logits, [0, 0, 0], q, sp, 5)
    assert a.num_accepted <= 1  # node 1 has p = 0: never accepted


def test_target_probs_match_the_sampling_rule():
    logits = torch.randn(3, 20)
    params = SamplingParams(temperature=0.5, top_k=6, top_p=0.7)
    expected = torch.softmax(process_logits(logits, params), -1)
    assert torch.equal(target_probs(logits, params), expected)
    assert torch.equal(target_probs(logits, GREEDY).argmax(-1), logits.argmax(-1))


# --- the noise streams rejection sampling adds to lookupspec/sampling.py ---------------------------


def test_stream_zero_is_the_sample_and_match_noise():
    seeds = torch.tensor([0, 5, 2**40 + 3, 2**62 + 11])
    positions = torch.tensor([0, 7, 2**33 + 1, 123456])
    keys = stream_keys(seeds, positions)
    for i in range(4):
        s, p = int(seeds[i]), positions[i : i + 1]
        assert torch.equal(keys[i : i + 1], position_keys(s, p))
        assert torch.equal(gumbel_from_keys(keys[i : i + 1], 64), gumbel_noise(s, p, 64))


def test_other_streams_are_distinct_uniform_and_finite():
    seeds = torch.arange(4096) * 7919
    positions = torch.arange(4096) % 97
    streams = [stream_keys(seeds, positions, s) for s in (0, STREAM_ACCEPT, STREAM_RECOVER, STREAM_DRAFT)]
    for i in range(4):
        for j in range(i):
            assert (streams[i] != streams[j]).float().mean() > 0.999
    u = accept_uniforms(streams[1])
    assert bool(((u > 0) & (u < 1)).all()) and abs(u.mean().item() - 0.5) < 0.02
    e = exponential_from_keys(streams[2][:64], 4096)
    assert bool(torch.isfinite(e).all() & (e > 0).all()) and abs(e.mean().item() - 1.0) < 0.02
