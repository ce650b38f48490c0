"""Malformed draft trees: host arrays are rejected with a clear ValueError before any kernel runs (the
packer, the verification and mask entry points, on both the Triton and the torch paths), and the
kernels' ancestor walks are bounded by the tree size, so even an array that reaches a kernel unchecked
(device tensors are not read back to be checked) ends instead of hanging."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from lookupspec.kernels import mask_triton, pack_requests, tree_mask, verify_batch, verify_triton
from lookupspec.kernels.verify_inputs import check_tree_parents

from lookupspec.sampling import SamplingParams

BAD = {
    "cycle": [-1, 2, 1],  # 1 -> 2 -> 1: `while cur >= 0` never ends
    "self": [-1, 1],
    "forward": [1, -1],
    "below-root": [-1, -3],
    "past-the-tree": [-1, 7],
}
SEEDED = SamplingParams(temperature=0.8, seed=5)


@pytest.mark.parametrize("name", BAD)
def test_the_packer_rejects_a_malformed_tree(name):
    parents = BAD[name]
    with pytest.raises(ValueError, match=r"malformed draft tree: parents\[\d+\]"):
        pack_requests([([5] * len(parents), parents)], [SamplingParams()], [10])


def test_check_tree_parents_accepts_trees_and_counts_nodes():
    check_tree_parents([-1, 0, 0, 2], 4)
    check_tree_parents([], 0)
    with pytest.raises(ValueError, match="needs 3 parents"):
        check_tree_parents([-1, 0], 3)


def _layout(parents, device="cpu"):
    n = len(parents)
    packed = pack_requests([([5] * n, [-1] * n)], [SEEDED], [10], device)._asdict()  # valid, then broken
    packed["parents"] = torch.tensor(parents, dtype=torch.int32, device=device)
    return packed, torch.randn(n + 1, 64, device=device)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("mode", ["greedy", "match"])
@pytest.mark.parametrize("name", BAD)
def test_verification_rejects_malformed_host_parents_on_both_paths(name, backend, mode):
    packed, logits = _layout(BAD[name])
    with pytest.raises(ValueError, match="malformed draft tree"):
        verify_batch(logits, **packed, mode=mode, backend=backend)


def test_verification_rejects_inconsistent_sizes():
    packed, logits = _layout([-1, 0, 1])
    packed["row_offsets"] = torch.tensor([0, 3], dtype=torch.int32)  # 2 nodes claimed, 3 given
    with pytest.raises(ValueError, match="do not describe"):
        verify_batch(logits, **packed, mode="greedy", backend="torch")
    packed, logits = _layout([-1, 0, 1])
    with pytest.raises(ValueError, match="more than max_nodes"):
        verify_batch(logits, **{**packed, "max_nodes": 2}, mode="greedy", backend="triton")


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("name", BAD)
def test_tree_mask_rejects_malformed_host_parents_on_both_paths(name, backend):
    with pytest.raises(ValueError, match="malformed draft tree"):
        tree_mask(torch.tensor(BAD[name]), 4, torch.float32, backend=backend)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["greedy", "match"])
@pytest.mark.parametrize("name", ["cycle", "self", "past-the-tree"])
def test_the_verify_kernels_end_on_a_malformed_tree_they_are_given_unchecked(name, mode, device):
    packed, logits = _layout(BAD[name], device)
    out = verify_triton.verify_batch(logits, **packed, mode=mode)  # no host check on this path
    num = int(out.num_accepted[0])
    assert 0 <= num <= len(BAD[name])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["cycle", "self", "past-the-tree"])
def test_the_mask_kernel_ends_on_a_malformed_tree_it_is_given_unchecked(name, device):
    mask, pos = mask_triton.tree_mask(torch.tensor(BAD[name], device=device), 4, torch.float32)
    assert mask.shape == (1, 1, len(BAD[name]), 4 + len(BAD[name]))
    assert int(pos.max()) <= 4 + len(BAD[name])
