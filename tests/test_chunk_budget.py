"""The prompt-chunk budget: whole blocks until something is measured, the ceiling while nothing decodes;
then the tokens that keep a forward near ``stretch`` plain steps, from the engine's cost per chunk
token (seeded by forwards alone), within [minimum, block] (the floor up to the ceiling), multiples of
8; an outlier forward moves the seed only so far."""

from __future__ import annotations

import pytest

from lookupspec.cost import ChunkBudget


def test_whole_blocks_until_a_cost_is_known_and_while_nothing_decodes() -> None:
    b = ChunkBudget(128, stretch=2.0)
    assert b.tokens(0.08) == 128  # nothing measured yet
    b.observe_alone(128, 0.30)  # a chunk alone: 2.3 ms a token (with the weights' read)
    assert b.tokens(None) == 128  # no step measured yet
    assert b.tokens(0.08) == 32  # (2 - 1) * 80 ms / 2.34 ms = 34 -> 32
    # the engine's price: what a shared forward's chunk costs beyond its step, 1.5 ms a token
    assert b.tokens(0.08, per_token=0.0015) == 48  # 53 -> 48
    assert b.tokens(None, per_token=0.0015) == 128


def test_the_size_stays_within_its_bounds_and_the_stretch_scales_it() -> None:
    b = ChunkBudget(128, stretch=3.0)
    assert b.tokens(0.02, per_token=0.001) == 40  # 1 ms a token
    assert b.tokens(0.001, per_token=0.001) == 16  # the minimum
    assert b.tokens(10.0, per_token=0.001) == 128  # a whole block at most
    assert ChunkBudget(8, stretch=3.0, minimum=16).minimum == 8
    off = ChunkBudget(128, stretch=0)
    off.observe_alone(16, 0.016)
    assert off.tokens(0.02, per_token=0.001) == 128


def test_the_prefill_keeps_ahead_of_the_decode() -> None:
    """Prompts of 720 tokens whose sequences decode in 120 steps, 8 slots: each prompt must be in
    within 120 / 8 = 15 forwards to keep the slots decoding, 48 tokens a forward, 72 with 1.5x
    headroom; with speculation (48 steps) whole chunks."""
    b = ChunkBudget(128, stretch=2.0)
    rate = 0.0015  # 1.5 ms a token
    assert b.tokens(0.08, slots=8, per_token=rate) == 48  # by the stretch alone
    b.observe_sequence(720, 120)
    assert b.tokens(0.08, slots=8, per_token=rate) == 72
    assert b.tokens(0.08, slots=2, per_token=rate) == 48  # two slots: the stretch's size is enough
    b = ChunkBudget(128, stretch=2.0, memory=0.0)
    b.observe_sequence(720, 48)
    assert b.tokens(0.08, slots=8, per_token=rate) == 128


def test_an_outlier_forward_moves_the_seed_only_so_far() -> None:
    b = ChunkBudget(128, stretch=2.0, memory=0.5)
    b.observe_alone(32, 0.032)
    b.observe_alone(32, 3.2)  # a forward slowed 100x by another process: capped at 3x
    assert b.alone == pytest.approx(0.5 * 0.001 + 0.5 * 0.003)
    b.observe_alone(0, 1.0)  # nothing carried, nothing learnt
    assert b.alone == pytest.approx(0.002)


@pytest.mark.parametrize("bad", [-1.0, 0.5, 1.0])
def test_a_stretch_must_be_off_or_above_one(bad) -> None:
    with pytest.raises(ValueError, match="stretch"):
        ChunkBudget(128, stretch=bad)


def test_the_floor_may_pass_the_block_up_to_the_ceiling_and_an_idle_forward_takes_the_ceiling() -> None:
    """Speculating sequences decode in ~56 steps: 8 slots of 720-token prompts need 103 tokens a
    forward, 155 with the headroom (160): past the block, within the ceiling; at 16 slots the
    ceiling caps it. The stretch's own size never passes the block."""
    b = ChunkBudget(128, stretch=2.0, memory=0.0, ceiling=256)
    b.observe_sequence(720, 56)
    assert b.tokens(0.08, slots=8, per_token=0.0015) == 160  # 1.5 ms a token
    assert b.tokens(0.08, slots=16, per_token=0.0015) == 256
    assert b.tokens(10.0, slots=1, per_token=0.0015) == 128  # the stretch alone: a block at most
    assert b.idle() == 256
    assert ChunkBudget(128, stretch=0, ceiling=256).idle() == 128  # stretch off: whole blocks always
    assert ChunkBudget(128, stretch=2.0, ceiling=64).ceiling == 128  # never below the block
    assert ChunkBudget(128, stretch=2.0).idle() == 128


def test_each_slot_counts_with_its_own_class_of_steps() -> None:
    """Plain sequences decode 128 tokens in 128 steps, speculating ones in ~56: after a run of
    speculating sequences, plain slots still get the plain floor (1.5 * 720 / 128 a slot, 8 slots: 72
    tokens a forward), not the speculating one (160); a mix counts each slot with its class; a class
    not seen yet borrows the other's."""
    b = ChunkBudget(128, stretch=2.0, memory=0.7, ceiling=256)
    rate = 0.0015
    b.observe_sequence(720, 128, speculating=False)
    assert b.tokens(0.01, slots=8, per_token=rate, speculating=8) == 72  # no speculating one seen yet
    for _ in range(10):
        b.observe_sequence(720, 56, speculating=True)
    assert b.steps == {False: 128.0, True: pytest.approx(56.0, abs=0.1)}
    assert b.tokens(0.01, slots=8, per_token=rate) == 72  # 8 plain slots
    assert b.tokens(0.01, slots=8, per_token=rate, speculating=8) == 160  # 155 -> 160
    assert b.tokens(0.01, slots=8, per_token=rate, speculating=4) == 112  # 1.5 * 720 * (4/128 + 4/56) = 111
    assert b.tokens(0.01, slots=8, per_token=rate, speculating=20) == 160  # at most every slot
