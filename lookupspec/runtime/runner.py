"""``ModelRunner``: the one seam between the engine and the model's execution.

The engine hands the runner token ids and tree structure; the runner owns everything about running
the target model: the attention implementation it is switched to, the lean forward where the
architecture allows one, the KV :class:`~lookupspec.runtime.kvpool.SlotPool`, device and dtype.

- ``forward(seqs, keep)`` runs a ragged batch (:mod:`lookupspec.runtime.ragged`): every sequence's
  rows (root + draft nodes, one token, or a chunk of a prompt) in one forward, each attending only to
  its own cache. Logits come back in one ``[rows, vocab]`` tensor, or only those of the rows in
  ``keep`` (a prompt chunk needs its last row's: the LM head over a 128-row chunk would cost a third
  of the chunk). The lean forward serves it where it covers the model; transformers' forward
  (switched to the runtime's attention) everywhere else.
- ``prefill(slot, ids)`` is ``forward`` of one prompt chunk alone, keeping its last row. Long prompts
  are prefilled in chunks, so a scheduler can run them in the same forwards as decode steps.
- ``cuda_graphs`` (``auto`` on CUDA, or ``on``): forwards go through the static-shape step instead,
  each bucket a replayed CUDA graph (eager on the CPU), where the model and the step allow
  (:mod:`lookupspec.runtime.static.serving`, which also says what changes: one scratch slot more).

When a runner is built it checks itself against the model (:meth:`ModelRunner._probe`):

1. the ragged path agrees with transformers' own forward and cache on a prompt and a draft tree
   (an architecture the runtime cannot serve, e.g. one that keeps recurrent state, fails here with
   a clear error instead of producing wrong tokens later). It runs first with every view's attention
   on the backends that plan nothing per shape (on CUDA, no cuDNN: a graph for each new shape costs
   tens of milliseconds, and a step's shapes are new at every step), transformers' forward on the
   same ones; where they disagree, masked views keep torch's choice (``unplanned_masks``);
2. batch invariance: one sequence's logits alone and among other sequences of different lengths and
   row counts (one token, a draft tree, a prompt chunk) must be bit-identical. Attention is per
   sequence (:func:`.attention.attend`), so the row-wise ops decide it, the linear layers above all.
   Packed float32 layers are batch-invariant as they are (:mod:`.cpu_linear`): the streaming
   kernel by construction, oneDNN's by padding one-row products where one row would take another
   kernel.
   For other layers the probe tries padding every one-row forward to
   two rows (``pad_to = 2``: bfloat16's products agree from two rows on). Where neither works
   (MKL's plain float32 ``sgemm`` depends on the row count throughout), ``batch_invariant`` is False:
   batched outputs may then differ from batch-of-one ones at float near-ties, which the benchmarks
   count.
3. chunk invariance: a prompt prefilled whole and in uneven chunks, then one decode row, must give
   bit-identical logits. It holds where every op is row-wise invariant and attention computes a row
   by its position alone (:mod:`.native.attention`'s kernel); SDPA's chunk-after-cache path does not.
   Where it holds (``chunk_invariant``), the scheduler may size prompt chunks by the load without
   changing a token.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lookupspec.kernels import HostStage

from .attention import active_batch, unplanned_sdpa, use_runtime_attention
from .kvpool import LayerSpec, PoolFull, SlotPool
from .lean import LeanForward
from .ragged import RaggedBatch, SeqRows

if TYPE_CHECKING:
    from .static import StaticPath, StepPlan

__all__ = ["ModelRunner", "RuntimeUnsupported", "layer_specs", "prepare_models"]


def prepare_models(target: Any, draft: Any | None = None, *, packed_linear: bool = True) -> None:
    """Load-time preparation of a target (and its draft model) for the runtime, in place: on CPU in
    float32, every ``nn.Linear`` becomes a prepacked layer (:mod:`.cpu_linear`; a
    ``self:layers=K`` draft shares the target's layers, and so their packed copies). The attention
    switch and the lean forward are the runner's business."""
    if not packed_linear:
        return
    from .cpu_linear import pack_linears

    memo: dict = {}
    pack_linears(target, memo=memo)
    if draft is not None:
        pack_linears(draft, memo=memo)


class RuntimeUnsupported(ValueError):
    """The model cannot be served by the runtime (the message says why)."""


def layer_specs(model: Any) -> list[LayerSpec]:
    """What each decoder layer caches, from the model's configuration: key/value heads, head sizes and
    the sliding window of layers that have one (``layer_types``, else a model-wide ``sliding_window``)."""
    cfg = model.config.get_text_config(decoder=True)
    if not (getattr(cfg, "num_attention_heads", None) and getattr(cfg, "num_hidden_layers", None)):
        kind = getattr(cfg, "model_type", type(model).__name__)
        raise RuntimeUnsupported(f"{kind} models keep no attention key/value cache that lookupspec's runtime "
                                 "could serve")
    n = int(cfg.num_hidden_layers)
    heads = int(cfg.num_attention_heads)
    kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    value_dim = int(getattr(cfg, "v_head_dim", None) or head_dim)
    window = getattr(cfg, "sliding_window", None)
    types = list(getattr(cfg, "layer_types", None) or [])
    if types:
        if len(types) < n:
            raise RuntimeUnsupported(f"layer_types lists {len(types)} layers for {n}")
        other = sorted({t for t in types[:n] if t not in ("full_attention", "sliding_attention")})
        if other:
            raise RuntimeUnsupported(f"layers of type {other} (not KV-cached attention) are not supported by "
                                     "lookupspec's runtime")
        windows = [int(window) if t == "sliding_attention" and window else None for t in types[:n]]
    elif window and getattr(cfg, "use_sliding_window", True):
        windows = [int(window)] * n
    else:
        windows = [None] * n
    return [LayerSpec(kv, head_dim, value_dim, w) for w in windows]


class ModelRunner:
    """Runs ``model`` (a transformers causal LM, already on its device and dtype; linear layers
    already packed where wanted) for many sequences at once.

    ``context_window``: positions a sequence may reach. ``max_batch``: sequences at once.
    ``kv_cache_bytes``: the slot pool's budget, reserved at once (None: grow as needed). ``max_rows``:
    the most rows a forward appends to one slot, which sizes sliding-window layers' slots (None: up
    to the context window; :class:`~lookupspec.runtime.kvpool.SlotPool`). ``lean``: use
    the lean forward where the model allows it. ``check``: run the self-check probe (tests switch it
    off only to build runners for models they then check by other means). ``cuda_graphs``: ``auto``,
    ``on`` or ``off`` (the module docstring; off unless asked, here: the engine's default is auto)."""

    def __init__(self, model: Any, *, context_window: int, lean: bool = True, max_batch: int = 64,
                 kv_cache_bytes: int | None = None, max_rows: int | None = None, check: bool = True,
                 cuda_graphs: str = "off") -> None:
        self.model = model
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        cfg = model.config.get_text_config(decoder=True)
        self.vocab_size = int(cfg.vocab_size)
        self.context_window = int(context_window)
        if not use_runtime_attention(model):
            raise RuntimeUnsupported(f"{type(model).__name__} cannot switch its attention implementation")
        self.layers = layer_specs(model)
        self.lean = LeanForward.for_model(model, [s.window for s in self.layers]) if lean else None
        self.max_batch = int(max_batch)  # sequences at once (the pool may hold the static step's scratch too)
        static = cuda_graphs != "off" and _static_serves(cuda_graphs, model, self.layers, self.device)
        self.pool = SlotPool(self.layers, dtype=self.dtype, device=self.device,
                             max_batch=max_batch + int(static), max_positions=self.context_window,
                             max_bytes=kv_cache_bytes, max_rows=max_rows)
        if kv_cache_bytes is not None:
            self.pool.reserve()  # a budget is memory set aside: take it now, not mid-load
        self.static: StaticPath | None = None  # the static step, where it serves (it holds one slot)
        if static:
            from .static import StaticPath

            self.static = StaticPath(model, self.pool, graphs=self.device.type == "cuda")
        self.pad_to = 1
        self._ones = torch.ones((1, 256), dtype=torch.bool, device=self.device)  # see _no_padding
        self.unplanned_masks = False  # decided by the probe (module docstring, check 1)
        self.batch_invariant: bool | None = None  # decided by the probe
        self._chunk_probe = (False, False)  # the probe's: (chunk-invariant, found with the native attention)
        if check:
            self._probe()

    # ---- slots --------------------------------------------------------------------------------------

    def allocate(self, positions: int) -> int:
        """A slot with room for ``positions`` positions. Raises :class:`PoolFull`."""
        return self.pool.allocate(positions)

    def free(self, slot: int) -> None:
        self.pool.free(slot)

    def length(self, slot: int) -> int:
        return int(self.pool.length[slot])

    def reserve(self, slot: int, positions: int) -> bool:
        """Make room for ``positions`` positions in ``slot``; False when the pool cannot."""
        try:
            self.pool.ensure(slot, positions)
        except PoolFull:
            return False
        return True

    # ---- forwards -----------------------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, slot: int, ids: Sequence[int]) -> torch.Tensor:
        """Append ``ids`` to ``slot`` (a causal chunk after its cached positions); returns the last
        row's logits ``[vocab]`` (float32). The same forward as a chunk that shares a batch with other
        sequences' rows (:meth:`forward` with ``keep``). Raises :class:`PoolFull` past the pool's
        limits."""
        stage = HostStage(self.device)
        last = stage.add(np.asarray([len(ids) - 1], np.int64), torch.int64)
        batch = self.plan([SeqRows(slot, ids)], stage)
        stage.upload()
        return self.run(batch, keep=last.tensor)[-1].float()

    @torch.inference_mode()
    def forward(self, seqs: Sequence[SeqRows], keep: torch.Tensor | None = None) -> torch.Tensor:
        """One forward over every sequence's rows; returns logits ``[rows, vocab]`` in the order of
        ``seqs`` (float32 for float32 models, the model's dtype otherwise), or only of the rows listed
        in ``keep`` (a 1-D index tensor on the runner's device). Each slot advances by its rows; the
        caller truncates what verification rejects."""
        return self.run(self.plan(seqs), keep)

    def plan(self, seqs: Sequence[SeqRows], stage: HostStage | None = None) -> RaggedBatch | StepPlan:
        """The host half of :meth:`forward`: room in every slot, then the batch's inputs as pieces of
        ``stage`` (the caller uploads it before :meth:`run`; None: a stage of the batch's own). Where
        the static step serves the step, its plan instead: its inputs travel in its own bucket's copy."""
        planned = self.static.plan(seqs) if self.static is not None else None
        if planned is not None:
            return planned
        for s in seqs:
            self.pool.ensure(s.slot, self.length(s.slot) + len(s.tokens))
        return RaggedBatch(self.pool, seqs, pad_to=self.pad_to, stage=stage,
                           unplanned_masks=self.unplanned_masks)

    @torch.inference_mode()
    def run(self, batch: RaggedBatch | StepPlan, keep: torch.Tensor | None = None) -> torch.Tensor:
        """The device half of :meth:`forward`, on a planned batch whose stage has been uploaded."""
        if not isinstance(batch, RaggedBatch):
            assert self.static is not None  # only the static step plans anything else
            return self.static.run(batch, keep)
        batch.bind()
        logits = self.lean(batch, keep) if self.lean is not None else self._hf(batch, keep)
        for v in batch.views:
            self.pool.advance(v.slot, v.rows)
        return logits if keep is not None else logits[: batch.real_rows]

    def bucket_choice(self) -> Callable[[int, int], Any] | None:
        """Where the static step serves: ``choose(rows, seqs)``, the bucket a step of that shape runs
        in (None where none holds it); None on the ragged path."""
        return None if self.static is None else self.static.step.buckets.choose

    @staticmethod
    def bucket_of(batch: RaggedBatch | StepPlan) -> Any:
        """The bucket a planned forward ran in: None on the ragged path, or where no configured
        bucket held it (it ran eagerly at its own size)."""
        if isinstance(batch, RaggedBatch) or batch.fallback is not None:
            return None
        return batch.bucket

    def _hf(self, batch: RaggedBatch, keep: torch.Tensor | None = None) -> torch.Tensor:
        with active_batch(batch):
            out = self.model(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False,
                             attention_mask=self._no_padding(batch.input_ids.shape[1]),
                             logits_to_keep=0 if keep is None else keep)
        return out.logits[0]

    def _no_padding(self, rows: int) -> torch.Tensor:
        """A ``[1, rows]`` all-true padding mask for transformers' forward. The runtime's attention
        builds its own masks, but without a padding mask transformers' mask preparation looks for
        packed sequences in the position ids (a ragged batch looks like some) and reads its finding
        back to the host: a device synchronisation in every forward on a GPU. A view of one buffer,
        grown when a forward is wider: no allocation per forward."""
        if self._ones.shape[1] < rows:
            self._ones = torch.ones((1, max(rows, 2 * self._ones.shape[1])), dtype=torch.bool,
                                    device=self.device)
        return self._ones[:, :rows]

    # ---- self-check ---------------------------------------------------------------------------------

    @torch.inference_mode()
    def _probe(self) -> None:
        """Run the checks of the module docstring on a small pool of their own (the served pool keeps
        its budget and slots). Check 1 is the ragged path's (it serves the steps no bucket holds);
        where the static step serves, checks 2 and 3 are its own, run eagerly (a graph replays the
        eager step's bits)."""
        served, static = self.pool, self.static
        self.pool = SlotPool(self.layers, dtype=self.dtype, device=self.device,
                             max_batch=4 + int(static is not None), max_positions=self.context_window,
                             initial_capacity=64)
        self.static = None
        try:
            self._probe_checks(static is not None)
        finally:
            self.pool, self.static = served, static

    def _probe_checks(self, static: bool = False) -> None:
        gen = torch.Generator().manual_seed(0)
        vocab = self.vocab_size

        def ids(n: int) -> list[int]:
            return torch.randint(min(3, vocab - 1), vocab, (n,), generator=gen).tolist()

        # within the smallest sliding window: transformers applies no window to a custom 4D tree mask
        windows = [s.window for s in self.layers if s.window is not None]
        self._check_backends(ids(max(1, min([11, *(w - 5 for w in windows)]))), ids(5), [-1, 0, 0, 1, 3])
        if static:
            from .static import StaticPath

            self.static = StaticPath(self.model, self.pool, graphs=False)
        prompts = {"a": ids(9), "b": ids(13), "c": ids(6), "d": ids(7)}
        rows = {"a": 1, "b": 1, "c": 5, "d": max(2, min(24, self.context_window - 8))}
        slots = {}
        try:
            for name, p in prompts.items():
                slots[name] = self.allocate(len(p) + rows[name])
                self.prefill(slots[name], p)
            a = SeqRows(slots["a"], ids(1))
            b = SeqRows(slots["b"], ids(1))
            c = SeqRows(slots["c"], ids(5), [-1, 0, 0, 1, 1])
            d = SeqRows(slots["d"], ids(rows["d"]))  # a prompt chunk sharing the forward with decode rows

            def run(seqs: list[SeqRows], pad_to: int) -> dict[int, torch.Tensor]:
                saved, self.pad_to = self.pad_to, pad_to
                try:
                    logits = self.forward(seqs)
                finally:
                    self.pad_to = saved
                out, row = {}, 0
                for s in seqs:
                    out[s.slot] = logits[row:row + len(s.tokens)].clone()
                    row += len(s.tokens)
                    self.pool.truncate(s.slot, self.length(s.slot) - len(s.tokens))
                return out

            mixed = [run([a, b], 1), run([b, a], 1), run([c, a], 1), run([a, c, b], 1), run([a, d, c], 1)]
            c_alone, d_alone = run([c], 1)[c.slot], run([d], 1)[d.slot]
            same_c = all(torch.equal(m[c.slot], c_alone) for m in mixed if c.slot in m)
            same_c = same_c and all(torch.equal(m[d.slot], d_alone) for m in mixed if d.slot in m)
            a_in = [m[a.slot] for m in mixed]
            consistent = same_c and all(torch.equal(x, a_in[0]) for x in a_in)
            for pad in (1, 2):
                if consistent and torch.equal(run([a], pad)[a.slot], a_in[0]):
                    self.pad_to, self.batch_invariant = pad, True
                    break
            else:
                self.pad_to, self.batch_invariant = 1, False
        finally:
            for slot in slots.values():
                self.free(slot)
        from .native import attention as native_attention

        native = self.device.type == "cpu" and native_attention.kernel() is not None and not static
        self._chunk_probe = (bool(self.batch_invariant) and self._chunking_changes_nothing(
            ids(max(2, min(40, self.context_window - 2))), ids(1)), native)

    @property
    def chunk_invariant(self) -> bool:
        """Whether the probe found the forward chunk-invariant (module docstring, check 3), with the
        attention in force now: a probe passed with the native CPU attention no longer holds once
        ``LOOKUPSPEC_CPU_ATTENTION=sdpa`` switches it off. False for a runner built unchecked."""
        from .native import attention as native_attention

        invariant, native = self._chunk_probe
        return invariant and (not native or native_attention.kernel() is not None)

    def _chunking_changes_nothing(self, prompt: list[int], token: list[int]) -> bool:
        """Whether ``prompt`` prefilled whole and in three uneven chunks gives the same bits: the last
        row's logits, and a following decode row's (which read every cached key and value)."""
        cut = [0, min(5, len(prompt) - 1), min(21, len(prompt) - 1), len(prompt)]
        results = []
        for bounds in ([0, len(prompt)], sorted(set(cut))):
            slot = self.allocate(len(prompt) + 1)
            try:
                for lo, hi in itertools.pairwise(bounds):
                    last = self.prefill(slot, prompt[lo:hi])
                results.append((last, self.forward([SeqRows(slot, token)])[-1].float()))
            finally:
                self.free(slot)
        (a, b), (c, d) = results
        return torch.equal(a, c) and torch.equal(b, d)

    def _check_backends(self, prompt: list[int], tokens: list[int], parents: list[int]) -> None:
        """Check 1 with masked views on the attention backends that plan nothing per shape, transformers'
        reference forward on the same ones (on CUDA, no cuDNN graph per new shape; elsewhere the same
        as torch's choice); where the two disagree, again with torch's choice for masked views, which
        then keep it (``unplanned_masks`` False)."""
        self.unplanned_masks = True
        try:
            self._check_against_transformers(prompt, tokens, parents)
            return
        except RuntimeUnsupported:
            self.unplanned_masks = False
        self._check_against_transformers(prompt, tokens, parents)

    def _check_against_transformers(self, prompt: list[int], tokens: list[int], parents: list[int]) -> None:
        """The ragged path against transformers' own forward and DynamicCache on one prompt and one
        draft tree; raises :class:`RuntimeUnsupported` when they disagree beyond float noise."""
        from transformers import DynamicCache

        from lookupspec import kernels
        from lookupspec.hf_compat import with_cache

        slot = self.allocate(len(prompt) + len(tokens))
        try:
            got_prefill = self.prefill(slot, prompt)
            got_tree = self.forward([SeqRows(slot, tokens, parents)]).float()
        except Exception as exc:
            raise RuntimeUnsupported(f"lookupspec's runtime cannot run {type(self.model).__name__}: "
                                     f"{type(exc).__name__}: {exc}") from exc
        finally:
            self.free(slot)
        cfg = self.model.config.get_text_config(decoder=True)
        cache = DynamicCache(config=cfg)
        x = torch.tensor([prompt], device=self.device)
        kv = with_cache(self.model, cache)
        with unplanned_sdpa(self.device) if self.unplanned_masks else contextlib.nullcontext():
            ref_prefill = self.model(input_ids=x, **kv, use_cache=True).logits[0, -1].float()
            mask, pos = kernels.tree_mask(torch.tensor(parents, device=self.device), len(prompt), self.dtype)
            ref_tree = self.model(input_ids=torch.tensor([tokens], device=self.device), **kv, use_cache=True,
                                  attention_mask=mask, position_ids=pos).logits[0].float()
        tol = 1e-3 if self.dtype == torch.float32 else 5e-2
        for name, got, ref in (("prefill", got_prefill, ref_prefill), ("tree", got_tree, ref_tree)):
            scale = max(1.0, float(ref.abs().max()))
            diff = float((got - ref).abs().max())
            if not diff <= tol * scale:
                raise RuntimeUnsupported(
                    f"lookupspec's runtime disagrees with transformers' forward for "
                    f"{type(self.model).__name__} ({name}: max logit difference {diff:.3g}); "
                    "this architecture is not supported")


def _static_serves(mode: str, model: Any, layers: list[LayerSpec], device: torch.device) -> bool:
    """Whether the static step serves ``model`` under ``mode`` (imported only when asked for)."""
    from .static.serving import serves

    return serves(mode, model, [spec.window for spec in layers], device)
