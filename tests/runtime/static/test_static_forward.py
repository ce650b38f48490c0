"""The static forward, run eagerly on the CPU, against today's ragged path on the tiny models: prompt
chunks, decode rows, draft trees and mixes of them, several sequences of different lengths, padding
rows, a sliding window whose group drops old entries. Logits agree within 1e-4 of their scale (the
attention sums in another order; measured ~1e-6) with the same greedy tokens; the rows' keys and
values land where today's path puts them (bit for bit in the first layer, whose inputs do not go
through attention yet); slots outside the step are untouched; and the forward has static shapes
and no host sync: two different steps of one bucket run the same ops on the same shapes, none of
which reads a value back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lookupspec.runtime import ModelRunner, SeqRows, prepare_models
from lookupspec.runtime.static import Bucket, StaticStep, unsupported

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "models"
TOL = 1e-4  # of the logits' scale


def _model(name: str, *, packed: bool = True):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(str(FIXTURES / name / "config.json"))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    if packed:  # batch-invariant linear layers: a row's products do not depend on the bucket's padding
        prepare_models(model)
    return model


def _pair(name: str, max_rows: int | None = None):
    """Today's runner (lean forward, native kernels where they build) and a static step over a pool
    of its own, on one model."""
    model = _model(name)
    ref = ModelRunner(model, context_window=256, max_batch=8, max_rows=max_rows, check=False)
    other = ModelRunner(model, context_window=256, max_batch=8, max_rows=max_rows, check=False, lean=False)
    return ref, StaticStep(model, other.pool)


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    scale = max(1.0, float(want.abs().max()))
    diff = float((got - want).abs().max())
    assert diff <= TOL * scale, f"{what}: max logit difference {diff:.3g} (scale {scale:.3g})"
    assert torch.equal(got.argmax(-1), want.argmax(-1)), f"{what}: greedy tokens differ"


def _same_kv(ref: ModelRunner, step: StaticStep, slots: list[tuple[int, int]]) -> None:
    for a, b in slots:
        n = ref.length(a)
        assert step.pool.length[b] == n
        for layer in range(len(ref.layers)):
            for part in ("keys", "values"):
                want = getattr(ref.pool, part)(layer)[a, :, :n]
                got = getattr(step.pool, part)(layer)[b, :, :n]
                if layer == 0:  # its inputs do not go through attention: bit for bit
                    assert torch.equal(got, want), f"layer 0 {part} of slot {b}"
                else:
                    torch.testing.assert_close(got, want, atol=TOL, rtol=TOL)


@pytest.mark.parametrize("name,max_rows", [("tiny-llama", None), ("tiny-qwen2", None), ("tiny-mistral", 16)],
                         ids=["llama", "qwen2-biases", "mistral-window-dropping"])
def test_the_static_forward_gives_todays_logits_and_kv(name: str, max_rows: int | None) -> None:
    ref, step = _pair(name, max_rows)
    gen = torch.Generator().manual_seed(0)

    def ids(n: int) -> list[int]:
        return torch.randint(3, 512, (n,), generator=gen).tolist()

    prompts = [ids(n) for n in (70, 9, 23)]  # 70: past the sliding group's 64 entries
    slots = [(ref.allocate(150), step.pool.allocate(150)) for _ in prompts]
    for (a, b), prompt in zip(slots, prompts, strict=True):  # prompt chunks of up to 16 rows
        for lo in range(0, len(prompt), 16):
            chunk = prompt[lo:lo + 16]
            _close(step.forward_rows([SeqRows(b, chunk)]), ref.forward([SeqRows(a, chunk)]), f"chunk {lo}")
    steps: list[list[tuple[int, list[int], list[int] | None]]] = [
        [(0, [ids(1)[0]], None), (1, ids(1), None), (2, ids(1), None)],  # decode rows: 3 of a 4-row bucket
        [(0, ids(6), [-1, 0, 0, 1, 1, 3]), (2, ids(1), None)],  # a draft tree and a decode row
        [(1, ids(11), None), (0, ids(5), [-1, 0, 1, 0, 3])],  # a prompt chunk beside a tree
        [(2, ids(16), [-1, *range(15)])],  # a 16-row chain: the bucket is full, no padding
    ]
    for k, rows in enumerate(steps):
        want = ref.forward([SeqRows(slots[i][0], t, p) for i, t, p in rows])
        got = step.forward_rows([SeqRows(slots[i][1], t, p) for i, t, p in rows])
        assert got.shape == want.shape
        _close(got, want, f"step {k}")
        _same_kv(ref, step, slots)
        for i, tokens, parents in rows:  # verification keeps the first row (the root) only
            if parents is not None:
                a, b = slots[i]
                ref.pool.truncate(a, ref.length(a) - len(tokens) + 1)
                step.pool.truncate(b, int(step.pool.length[b]) - len(tokens) + 1)
    windows = {s.window for s in ref.layers}
    if max_rows is not None:  # the sliding group has dropped entries: its start has moved
        assert windows == {12}
        assert all(int(step.pool.groups[0].start[b]) > 0 for _, b in slots[:1])


def test_padding_rows_write_only_the_scratch_slot() -> None:
    _, step = _pair("tiny-llama")
    a, idle = step.pool.allocate(32), step.pool.allocate(32)
    step.forward_rows([SeqRows(idle, list(range(3, 20)))])
    before = [t.clone() for g in step.pool.groups for t in g.tensors]
    plan = step.plan([SeqRows(a, [5, 6, 7])])
    assert plan.bucket == Bucket(4, 1) and plan.real_rows == 3  # one padding row
    views = step.upload(plan)
    assert views.write_slot.tolist() == [a, a, a, step.scratch]
    step.run(plan)
    others = [s for s in range(step.pool.slots) if s not in (a, step.scratch)]
    for b, t in zip(before, [t for g in step.pool.groups for t in g.tensors], strict=True):
        assert torch.equal(b[:, others], t[:, others]), "a slot outside the step changed"
        assert torch.equal(b[:, a, :, 3:], t[:, a, :, 3:]), "the step wrote past its rows"
        assert not torch.equal(b[:, a, :, :3], t[:, a, :, :3]), "the step's rows were not written"


class _Ops(TorchDispatchMode):
    """Every aten op a forward runs, with its tensor arguments' shapes and dtypes."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        def sig(x):
            if isinstance(x, torch.Tensor):
                return (tuple(x.shape), x.dtype)
            if isinstance(x, (list, tuple)):
                return tuple(sig(y) for y in x)
            return None

        self.ops.append((str(func), sig(args), sig(tuple((kwargs or {}).values()))))
        return func(*args, **(kwargs or {}))


SYNCING = ("_local_scalar_dense", "nonzero", "masked_select", "is_nonzero", "aten.equal", "allclose",
           "unique", "_assert_async", "item")


def test_the_forward_has_static_shapes_and_reads_nothing_back() -> None:
    """Two steps of one bucket with different contents (a tree and two decode rows; three chunks) run
    the same ops on the same shapes, and none of them is an op that syncs with the host."""
    model = _model("tiny-mistral", packed=False)  # plain nn.Linear, as on the GPU; a sliding window
    pool = ModelRunner(model, context_window=256, max_batch=8, check=False, lean=False).pool
    step = StaticStep(model, pool)
    a, b, c = (step.pool.allocate(64) for _ in range(3))
    step.forward_rows([SeqRows(a, list(range(3, 30)))])
    step.forward_rows([SeqRows(b, list(range(3, 8)))])
    traces = []
    for seqs in ([SeqRows(a, [4, 5, 6, 7], [-1, 0, 0, 2]), SeqRows(b, [9]), SeqRows(c, [3])],
                 [SeqRows(c, [3, 4]), SeqRows(b, [10, 11]), SeqRows(a, [12])]):
        plan = step.plan(seqs)
        assert plan.bucket == Bucket(8, 4)
        views = step.upload(plan)
        with _Ops() as ops:
            step.forward(views, step.pool)
        step.commit(plan)
        traces.append(ops.ops)
    assert traces[0] == traces[1]
    names = {op[0] for op in traces[0]}
    assert not [n for n in names if any(s in n for s in SYNCING)], sorted(names)
    assert any("index_put" in n for n in names)  # the KV writes are indexed copies


def test_models_outside_the_llama_family_are_declined_with_a_reason() -> None:
    gemma = _model("tiny-gemma2", packed=False)
    reason = unsupported(gemma, [None] * 4)
    assert reason is not None and "gemma2" in reason
    llama = _model("tiny-llama", packed=False)
    assert unsupported(llama, [None, None]) is None
    assert "1 layers for 2" in (unsupported(llama, [None]) or "")
