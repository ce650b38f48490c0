"""Options shared by the commands that load a model, and their mapping onto the core's configuration
objects (:mod:`lookupspec.config`): :func:`model_config` and :func:`engine_config` turn the parsed
flags (whose defaults come from the environment) into a :class:`~lookupspec.config.ModelConfig` and an
:class:`~lookupspec.config.EngineConfig`."""

from __future__ import annotations

import argparse
import os
from typing import Any

from lookupspec.config import CUDA_GRAPHS, DTYPES, WEIGHTS, EngineConfig, ModelConfig
from lookupspec.models import DEFAULT_MODEL

CPU_LINEAR = ("auto", "stream", "onednn")
CPU_ATTENTION = ("auto", "native", "sdpa")
LEAN_NATIVE = ("auto", "native", "torch")


class _Environ(argparse.Action):
    """An option recorded in the environment variable ``env``: ``--cpu-linear`` in
    ``LOOKUPSPEC_CPU_LINEAR``, which the packing reads (:mod:`lookupspec.runtime.native.matmul`),
    ``--cpu-attention`` in ``LOOKUPSPEC_CPU_ATTENTION`` and ``--lean-native`` in
    ``LOOKUPSPEC_LEAN_NATIVE``, which every forward reads (:mod:`lookupspec.runtime.native.attention`,
    :mod:`lookupspec.runtime.native.layer_ops`), and ``--weights`` in ``LOOKUPSPEC_WEIGHTS``, which
    :func:`lookupspec.models.load_model` reads, so they hold for every model this process loads."""

    def __init__(self, *args, env: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.env = env

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        os.environ[self.env] = str(values)
        setattr(namespace, self.dest, values)


def _environ_choice(parser: argparse.ArgumentParser | argparse._ArgumentGroup, flag: str,
                    choices: tuple[str, ...], env: str, text: str) -> None:
    """A ``choices`` option kept in the environment variable ``env`` (default: its value, else
    "auto")."""
    parser.add_argument(flag, choices=choices, action=_Environ, env=env, default=os.environ.get(env, "auto"),
                        help=f"{text} (default auto) [env {env}]")


def add_model_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument("--model", default=os.environ.get("LOOKUPSPEC_MODEL", DEFAULT_MODEL),
                        help="named model, Hugging Face directory or .gguf file [env LOOKUPSPEC_MODEL]")
    parser.add_argument("--dtype", default=os.environ.get("LOOKUPSPEC_DTYPE", "float32"), choices=DTYPES,
                        help="weights and compute dtype; auto: bfloat16 on CUDA, float32 on the CPU "
                             "(default float32) [env LOOKUPSPEC_DTYPE]")
    parser.add_argument("--device", default=os.environ.get("LOOKUPSPEC_DEVICE", "cpu"),
                        help="cpu or cuda[:N] [env LOOKUPSPEC_DEVICE]")
    _environ_choice(parser, "--weights", WEIGHTS, "LOOKUPSPEC_WEIGHTS",
                    "how a GGUF model's quantized linear layers are held: quantized (multiplied as they are "
                    "by lookupspec's CPU kernel, the float32 path's outputs from a fraction of the bytes), "
                    "float32 (dequantized at load), or auto: quantized on the CPU in float32 where the "
                    "kernel builds")
    parser.add_argument("--no-packed-linear", dest="packed_linear", action="store_false",
                        default=os.environ.get("LOOKUPSPEC_PACKED_LINEAR", "1") not in ("0", "false", "no"),
                        help="on CPU float32, keep PyTorch's own linear layers instead of prepacked "
                             "weights (slower; for comparison) [env LOOKUPSPEC_PACKED_LINEAR=0]")
    _environ_choice(parser, "--cpu-linear", CPU_LINEAR, "LOOKUPSPEC_CPU_LINEAR",
                    "which matmul runs the prepacked CPU float32 layers: stream (lookupspec's streaming "
                    "kernel, compiled with the system C compiler on first use; fastest for decoding), "
                    "onednn (PyTorch's oneDNN), or auto: stream where it builds, else onednn")
    _environ_choice(parser, "--cpu-attention", CPU_ATTENTION, "LOOKUPSPEC_CPU_ATTENTION",
                    "attention on the CPU in float32: native (lookupspec's kernel, one call per layer for "
                    "the whole batch, compiled with the system C compiler on first use), sdpa "
                    "(PyTorch's, once per sequence), or auto: native where it builds, else sdpa")
    _environ_choice(parser, "--lean-native", LEAN_NATIVE, "LOOKUPSPEC_LEAN_NATIVE",
                    "the lean forward's rotary embedding, KV-pool writes, residual sums and RMSNorms: "
                    "native (one C call each, compiled on first use; the same bits), torch (PyTorch "
                    "ops), or auto: native where it builds, else torch")
    parser.add_argument("--no-lean-forward", dest="lean_forward", action="store_false",
                        default=os.environ.get("LOOKUPSPEC_LEAN_FORWARD", "1") not in ("0", "false", "no"),
                        help="decode and verify through transformers' own forward instead of lookupspec's "
                             "lean one (same output, slower; saves the ~280 MB fused copy of the q/k/v and "
                             "gate/up weights for SmolLM2-135M) [env LOOKUPSPEC_LEAN_FORWARD=0]")
    parser.add_argument("--cuda-graphs", choices=CUDA_GRAPHS,
                        default=os.environ.get("LOOKUPSPEC_CUDA_GRAPHS", "auto"),
                        help="run each step through the static-shape step, one CUDA graph per bucket of "
                             "rows, replayed (models and steps it cannot serve keep the ragged path, logged "
                             "once); auto: on for CUDA devices; on: also on the CPU, eagerly (slower; for "
                             "tests) (default auto) [env LOOKUPSPEC_CUDA_GRAPHS]")


def model_config(args: argparse.Namespace, *, auto_pull: bool = True) -> ModelConfig:
    """The :class:`ModelConfig` of :func:`add_model_arguments`' flags (and ``--draft-model`` where the
    command has it). ``--cpu-linear``, ``--cpu-attention`` and ``--lean-native`` are not in it: the
    native kernels read them from the environment, where the flags put them."""
    return ModelConfig(draft_model=getattr(args, "draft_model", None) or None, dtype=args.dtype,
                       device=args.device, auto_pull=auto_pull, packed_linear=args.packed_linear,
                       weights=args.weights)


def engine_config(args: argparse.Namespace, **settings: Any) -> EngineConfig:
    """The :class:`EngineConfig` of :func:`add_model_arguments`' flags (``--no-lean-forward``,
    ``--cuda-graphs``) and the command's own (``settings``: e.g. the serve command's batching and cache
    flags)."""
    return EngineConfig(lean=args.lean_forward, cuda_graphs=args.cuda_graphs, **settings)


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value
