"""How many prompt tokens the scheduler's next forward may carry while other sequences decode.

A prompt chunk rides in the same forward as the running sequences' step (:mod:`lookupspec.scheduler`),
so every running stream waits for the chunk: with 128-token chunks on a 2-core CPU a decode step of
~60 ms becomes a forward of ~290 ms, the inter-token gap a stream sees each time another request is
prefilled. Smaller chunks shorten that gap and slow the prefill (more forwards, each reading the
weights); whole chunks do the opposite. :class:`ChunkBudget` sizes the chunk so that the forward
takes about ``stretch`` times the plain step of the batch the server is serving::

    tokens = (stretch - 1) * plain_step_seconds / seconds_per_chunk_token

``plain_step_seconds`` comes from the step-cost model: one row for every sequence that holds a slot,
the ones still being prefilled included. That yardstick follows the load and not the moment: with
the steps of only the sequences decoding now, a burst of new requests (few decoding, many
prefilling) would get small chunks exactly when their prefill is most of the work, and their slow
prefill would keep the batch small (measured: a mean batch of 1.4 of 8, 16-token chunks).
``seconds_per_chunk_token`` is measured once, by the engine: what forwards that carried a chunk cost
beyond their step's own estimate, per chunk token, exponentially averaged
(:attr:`lookupspec.cost.step.StepCostModel.chunk_row_s`, the price the drafting policy puts on a
draft row in such a forward too). The scheduler passes it to :meth:`ChunkBudget.tokens`; until the
engine has it, forwards that carried chunks alone seed the rate (an overestimate: they also read the
weights).

A floor keeps the prefill ahead of the decode. Prompts are prefilled one after another (oldest
first), so with ``S`` slots whose sequences decode in ``D`` steps each, every prompt of ``P`` tokens
must be in within ``D / S`` forwards, or slots sit in prefill and the batch shrinks: at least
``headroom * P * S / D`` tokens a forward (``P`` and ``D`` averaged over finished sequences). With
speculation a sequence needs fewer steps (128 tokens in ~50 instead of 128), and the floor is what
keeps its chunks whole: without it, 8 speculating streams of 726-token prompts ran at a mean batch
of 3.4 of 8 (TTFT p50 8.4x one stream's). ``D`` is kept apart for speculating and plain sequences
and each slot counts with its own class's (the sum of ``P / D`` over the slots): with one average,
plain requests that followed a run of speculating ones were given the speculating ones' floor, twice
the tokens they needed, until enough of them had finished (a Zen 5 EPYC, 8 plain streams of the
default prompts after 8 speculating ones: the first round's streams saw gaps of up to 140-190 ms,
where they see up to ~105 ms with the floor by class; inter-token p99 of the pass 108-118 ms against
~100).

The stretch's tokens stay within ``[minimum, block]`` (``block``: ``--prefill-chunk``). The floor may
pass the block, up to a ``ceiling`` (the scheduler's: two blocks, within ``--max-batch-tokens``): with
speculation a sequence decodes 128 tokens in ~57 steps, so 8 slots of 726-token prompts need ~100
prompt tokens a forward, 150 with the headroom, and whole blocks of 128 kept 2 of the 8 slots in
prefill on average (a 2-core EPYC, measured). Sizes are rounded to a multiple of 8 (the stretch's
down, the floor's up). With nothing decoding no stream waits for the forward, so it takes the
``ceiling``; before anything was measured, a whole ``block``.

Only a chunk-invariant forward (:attr:`lookupspec.engine.Engine.free_chunks`) lets the chunk size
follow the load: there a prompt's tokens and its prefix-cache blocks are the same bits in any
chunking. Elsewhere the scheduler keeps whole chunks at fixed offsets.
"""

from __future__ import annotations

import math

__all__ = ["ChunkBudget"]


class ChunkBudget:
    """Prompt tokens per forward while sequences decode (see the module docstring). ``stretch``: the
    forward with a chunk may take this many times the plain step (0: whole blocks always).
    ``minimum``: the smallest chunk worth a forward's share. ``memory``: the average's weight on the
    past. ``ceiling``: the most tokens a forward may carry when the floor asks for more than a block
    or nothing decodes (default: the block)."""

    def __init__(self, block: int, stretch: float, minimum: int = 16, memory: float = 0.7,
                 headroom: float = 1.5, ceiling: int | None = None) -> None:
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        if not (stretch == 0 or stretch > 1):
            raise ValueError(f"stretch must be 0 (off) or > 1, got {stretch}")
        self.block = block
        self.stretch = stretch
        self.minimum = max(1, min(minimum, block))
        self.ceiling = block if ceiling is None else max(block, ceiling)
        self.memory = memory
        self.headroom = headroom
        self.prompt_tokens: float | None = None  # prompt tokens a finished sequence had prefilled
        self.steps: dict[bool, float] = {}  # decode steps a finished sequence took, by speculating
        self.alone: float | None = None  # seconds per chunk token in forwards with no step (a seed)

    def observe_alone(self, tokens: int, seconds: float) -> None:
        """A forward with no step carried ``tokens`` prompt tokens in ``seconds``: a seed for the
        rate until the shared forwards' price is known (it includes the weights' read, so it is
        high). A sample over three times the average (another process slowed the forward) is
        capped."""
        if tokens <= 0 or seconds <= 0:
            return
        rate = seconds / tokens
        if self.alone is not None:
            rate = min(rate, 3.0 * self.alone)
        self.alone = self._average(self.alone, rate)

    def observe_sequence(self, prefilled: float, steps: int, speculating: bool = False) -> None:
        """A sequence finished after ``prefilled`` prompt tokens (its share of a shared prefill) and
        ``steps`` decode steps; ``speculating``: it drafted (its class's average of steps)."""
        if steps > 0:
            self.prompt_tokens = self._average(self.prompt_tokens, prefilled)
            self.steps[speculating] = self._average(self.steps.get(speculating), float(steps))

    def _slot_rate(self, slots: int, speculating: int) -> float | None:
        """The sum over the slots of 1 / their class's steps (a class not seen yet: the other's)."""
        plain = self.steps.get(False, self.steps.get(True))
        spec = self.steps.get(True, plain)
        if plain is None or spec is None:  # nothing finished yet (averages are of steps > 0)
            return None
        speculating = max(0, min(slots, speculating))
        return (slots - speculating) / plain + speculating / spec

    def _average(self, old: float | None, new: float) -> float:
        return new if old is None else self.memory * old + (1 - self.memory) * new

    def tokens(self, plain_step_s: float | None, slots: int = 1, per_token: float | None = None,
               speculating: int = 0) -> int:
        """This forward's prompt tokens while sequences decode, for a plain step of ``plain_step_s``
        seconds (None: not measured yet, a whole block) with ``slots`` sequences holding slots,
        ``speculating`` of them drafting (the floor that keeps prefill ahead of the decode, see the
        module docstring). ``per_token``: the engine's seconds per chunk token in a shared forward
        (None: not measured yet, the forwards alone's seed)."""
        rate = per_token if per_token is not None else self.alone
        if not self.stretch or plain_step_s is None or plain_step_s <= 0 or rate is None:
            return self.block
        size = int((self.stretch - 1.0) * plain_step_s / rate) // 8 * 8
        size = max(self.minimum, min(self.block, size))
        per_step = self._slot_rate(slots, speculating)
        if self.prompt_tokens is not None and per_step:  # prefill keeps ahead of the decode
            floor = math.ceil(self.headroom * self.prompt_tokens * per_step / 8) * 8
            size = max(size, min(self.ceiling, floor))
        return size

    def idle(self) -> int:
        """A forward's prompt tokens while nothing decodes: nobody waits for it, so the ceiling (a
        block with the stretch off)."""
        return self.ceiling if self.stretch else self.block
