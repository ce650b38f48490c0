"""Every tensor a step creates follows the model's device, and a step moves data between host and
device exactly twice: one host-to-device copy of its inputs, one device-to-host read of its results.

There is no GPU here, so the tests watch the calls that decide where tensors go, with a
``TorchFunctionMode`` that sees every torch call made inside ``Engine.prefill`` / ``Engine.step``:

- A factory call (``torch.tensor``, ``arange``, ``zeros``, ``empty``, ``full``, ``ones``, ...) must name
  its device, and name it as a ``torch.device`` equal to the model's (``x.device``, ``self.device``):
  a call without a device lands on the CPU whatever the model's device is (the CUDA crash of sampled
  requests), and a literal ``"cpu"`` would too. ``*_like`` / ``new_*`` inherit their input's device and
  must produce a tensor on the model's device.
- The one exception is the allow-list below: host-side tensors that are explicitly ``"cpu"`` and never
  meet a model tensor in a torch call (the test checks that as well).
- Host data enters the device only through tensors built from it (``torch.tensor``, ``as_tensor``,
  ``asarray``, ``from_numpy``, ``frombuffer``, ``new_tensor``) or ``.to`` / ``copy_`` of a host
  tensor. Inside a step none may happen outside :class:`lookupspec.kernels.HostStage`, whose
  ``upload`` runs exactly once per step: that is the one host-to-device copy. (Indexing with a Python
  list would be a hidden one this mode cannot see; the step code has none.)
- Reads of device values on the host (``tolist``, ``item``, ``numpy``, ``cpu``, ``bool()``,
  ``int()``, ``float()``) are counted: exactly one per step. Two call sites are not the engine's: the
  torch twins (``kernels/reference.py``) read values, and build their results from host values, where
  that is free on the CPU, which is the only device they run on by default (CUDA gets the Triton
  kernels, which read nothing back: the same test runs them in the interpreter), and the Triton
  interpreter's own copies of kernel arguments.

Draft-model drafting is host-driven (one forward and one token read per drafted token); the transfer
test uses lookup drafts, the device test covers the draft model too.
"""

from __future__ import annotations

import os
import sys
import warnings
import weakref
from collections import Counter
from pathlib import Path

import pytest
import torch
from scripted import ScriptedDrafting
from torch.overrides import TorchFunctionMode

from lookupspec import kernels
from lookupspec.cost import BudgetPolicy
from lookupspec.engine import Engine
from lookupspec.params import GenerationParams, SpecParams
from lookupspec.sampling import SamplingParams

FIXED = BudgetPolicy(adaptive=False)
PROMPT = list(range(40, 90))
GREEDY = SamplingParams()
SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=3)

FROM_SCRATCH = {torch.tensor, torch.as_tensor, torch.asarray, torch.from_numpy, torch.frombuffer,
                torch.arange, torch.zeros, torch.ones, torch.empty, torch.full, torch.rand, torch.randn,
                torch.randint, torch.linspace, torch.eye, torch.empty_strided, torch.scalar_tensor}
INHERITING = {torch.zeros_like, torch.ones_like, torch.empty_like, torch.full_like, torch.rand_like,
              torch.randn_like, torch.randint_like, torch.Tensor.new_zeros, torch.Tensor.new_ones,
              torch.Tensor.new_empty, torch.Tensor.new_full, torch.Tensor.new_tensor}
HOST_DATA = {torch.tensor, torch.as_tensor, torch.asarray, torch.from_numpy, torch.frombuffer,
             torch.Tensor.new_tensor}
READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.numpy, torch.Tensor.cpu, torch.Tensor.__bool__,
         torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__}
MOVES = {torch.Tensor.to, torch.Tensor.copy_, torch.Tensor.cuda}

ROOT = Path(__file__).resolve().parents[2]
TORCH_DIR = str(Path(torch.__file__).parent)
THIS = str(Path(__file__).resolve())
# Host-side tensors a step may create with device="cpu" (call sites as (file, function)):
ALLOWED_HOST = {
    # the staging buffer: host data is packed into it and it is moved to the device once (pinned on CUDA)
    ("kernels/staging.py", "upload"),
}
NOT_ENGINE_READS = ("kernels/reference.py",)  # the torch twins' CPU-only reads and host data (docstring)


def _site() -> tuple[str, str, int]:
    """(repo-relative file, function, line) of the first frame outside torch and this file."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(TORCH_DIR) and name != THIS and "/torch/" not in name:
            try:
                rel = str(Path(name).resolve().relative_to(ROOT))
            except ValueError:
                rel = name
            return rel, f.f_code.co_name, f.f_lineno
        f = f.f_back
    return "?", "?", 0


def _in_triton(site: tuple[str, str, int]) -> bool:
    return "/triton/" in site[0]


class DeviceRecorder(TorchFunctionMode):
    """Records the calls of the module docstring while active; ``problems`` lists the violations."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.problems: list[str] = []
        self.reads: list[tuple[str, str, int]] = []
        self.host_data: list[tuple[str, str, int]] = []
        self.factories: Counter = Counter()
        self._host: dict[int, weakref.ref] = {}  # allow-listed host tensors, by id

    def _is_host(self, x: object) -> bool:
        ref = self._host.get(id(x))
        return ref is not None and ref() is x

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) or func.__name__ in (
                "__get__", "__set__", "data_ptr", "element_size", "dim", "size", "stride", "numel"):
            return out  # attribute reads and indexing: no data moves, nothing is created from host data
        site = _site()
        if _in_triton(site):
            return out  # the interpreter's own argument copies
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if func in FROM_SCRATCH:
            self.factories[site[:2]] += 1
            dev = kwargs.get("device")
            if site[:2] in ALLOWED_HOST:
                if dev != "cpu":
                    self.problems.append(f"{site}: the allow-listed host tensor must say device='cpu'")
                if isinstance(out, torch.Tensor):
                    self._host[id(out)] = weakref.ref(out)
            elif dev is None:
                self.problems.append(f"{site}: {func.__name__} without an explicit device")
            elif not isinstance(dev, torch.device) or dev != self.device:
                self.problems.append(f"{site}: {func.__name__} on device {dev!r}, not the model's "
                                     f"{self.device} (as a torch.device)")
            from_host = not (args and isinstance(args[0], torch.Tensor))  # as_tensor(t) is t itself
            if (func in HOST_DATA and from_host and site[:2] not in ALLOWED_HOST
                    and not site[0].endswith(NOT_ENGINE_READS)):
                self.host_data.append(site)
        elif func in INHERITING:
            if isinstance(out, torch.Tensor) and out.device != self.device:
                self.problems.append(f"{site}: {func.__name__} made a tensor on {out.device}")
            if func in HOST_DATA:
                self.host_data.append(site)
        elif func in READS:
            if not any(self._is_host(t) for t in tensors) and not site[0].endswith(NOT_ENGINE_READS):
                self.reads.append(site)
        elif func in MOVES:
            if tensors and self._is_host(tensors[0]) and site[:2] not in ALLOWED_HOST:
                self.problems.append(f"{site}: a host tensor moved outside the staging upload")
        elif any(self._is_host(t) for t in tensors) and not all(self._is_host(t) for t in tensors):
            self.problems.append(f"{site}: {func.__name__} combines an allow-listed host tensor with model "
                                 "tensors")
        return out


def _engine(model, *, draft_model=None, shape="tree", truth=()):
    return Engine(model, draft_model=draft_model, lookup=ScriptedDrafting(list(truth), shape, 512),
                  policy=FIXED)


def _drive(engine, params, spec, recorder, *, steps_only=False):
    """Generate PROMPT with every prefill and step under ``recorder``; returns per-step counts."""
    seq = engine.start(PROMPT, params, spec)
    per_step = []
    try:
        with recorder if not steps_only else _Null():
            out = engine.prefill(seq)
        assert out is not None
        while seq.finish_reason is None:
            uploads, reads, host = kernels.HostStage.uploads, len(recorder.reads), len(recorder.host_data)
            with recorder:
                engine.step([seq])
            per_step.append((kernels.HostStage.uploads - uploads, len(recorder.reads) - reads,
                             len(recorder.host_data) - host))
    finally:
        engine.release(seq)
    return per_step


class CudaSyncs:
    """The synchronising CUDA calls made while active, as CUDA's sync debug mode reports them: their
    sites go to ``reads``, so :func:`_drive` counts them per step as it counts the recorder's reads."""

    def __init__(self) -> None:
        self.reads: list[str] = []
        self.host_data: list[str] = []

    def __enter__(self):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's notice that the mode is a prototype
            torch.cuda.set_sync_debug_mode("warn")
        self._catching = warnings.catch_warnings(record=True)
        self._caught = self._catching.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self._catching.__exit__(*exc)
        self.reads += [f"{w.filename}:{w.lineno}" for w in self._caught if "synchroniz" in str(w.message)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.cuda.set_sync_debug_mode("default")
        return False


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _plain(model, params):
    eng = Engine(model, lookup=ScriptedDrafting([], "none", 512))
    return [t for s in eng.generate(PROMPT, params, spec=SpecParams(enabled=False)) for t in s.tokens]


@pytest.mark.parametrize("case", ["greedy-tree", "seeded-chain", "seeded-tree", "draft-model-seeded",
                                  "draft-model-greedy"])
def test_every_tensor_a_step_creates_follows_the_model_device(tiny_loaded, tiny_draft, case):
    model = tiny_loaded.model
    sampling = GREEDY if "greedy" in case else SEEDED
    params = GenerationParams(max_tokens=24, sampling=sampling)
    device = next(model.parameters()).device
    if case.startswith("draft-model"):
        engine = _engine(model, draft_model=tiny_draft.model, shape="none")
        spec = SpecParams(max_draft_tokens=4, sources=("draft_model",))
    else:
        engine = _engine(model, shape=case.split("-")[1], truth=_plain(model, params))
        spec = SpecParams(max_draft_tokens=8, tree=case.endswith("tree"))
    rec = DeviceRecorder(device)
    _drive(engine, params, spec, rec)
    assert not rec.problems, "\n".join(dict.fromkeys(rec.problems))
    assert sum(rec.factories.values()) > 0  # the mode really saw the step's factory calls
    if case.startswith("draft-model"):
        assert any(f == "lookupspec/drafting/draft_model.py" for f, _ in rec.factories)


def test_the_recorder_catches_a_factory_call_without_a_device():
    rec = DeviceRecorder(torch.device("cpu"))
    with rec:
        positions = torch.tensor([5])  # a factory call that leaves the device to torch's default
        torch.arange(3, device=torch.device("cpu"))
        torch.zeros(2, device="cpu")  # a literal "cpu" outside the allow-list
    assert len(rec.problems) == 2 and "without an explicit device" in rec.problems[0]
    assert "not the model's" in rec.problems[1]
    assert positions.device.type == "cpu"


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_step_makes_one_upload_and_one_read(tiny_models, backend, sampling, monkeypatch):
    from lookupspec.models import load_model

    monkeypatch.setenv(kernels.BACKEND_ENV, backend)
    # Triton's case runs the compiled kernels on a CUDA model where there is a GPU, and the CPU model's
    # kernels in the interpreter elsewhere (tests/conftest.py turns it on where CUDA is absent)
    on_gpu = backend == "triton" and torch.cuda.is_available()
    if backend == "triton" and not on_gpu and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("a CPU model's Triton kernels need TRITON_INTERPRET=1 or a GPU")
    # sliding and full layers: two pool groups
    model = load_model(str(tiny_models["tiny-qwen2"]), device="cuda" if on_gpu else "cpu").model
    params = GenerationParams(max_tokens=16 if backend == "triton" else 30, sampling=sampling)
    engine = _engine(model, shape="tree", truth=_plain(model, params))
    rec = DeviceRecorder(next(model.parameters()).device)
    per_step = _drive(engine, params, SpecParams(max_draft_tokens=8, tree=True), rec, steps_only=True)
    assert not rec.problems, "\n".join(dict.fromkeys(rec.problems))
    assert per_step and all(s == (1, 1, 0) for s in per_step), (per_step, rec.reads, rec.host_data)
    if on_gpu:  # CUDA's own count: the one read is the step's only synchronisation (no hidden ones)
        syncs = CudaSyncs()
        per_step = _drive(engine, params, SpecParams(max_draft_tokens=8, tree=True), syncs, steps_only=True)
        assert per_step and all(s == (1, 1, 0) for s in per_step), (per_step, syncs.reads)
