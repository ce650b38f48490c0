"""Fused verification kernels against their torch twins, and a decode step with and without them (CUDA).

Part 1 times ``verify_batch`` (Triton) against ``reference.verify_batch`` (torch) for every batch
size x nodes per request x vocabulary x dtype x mode: medians of CUDA-event timings over many runs,
plus whether both gave identical outputs. Part 2 times one speculative decode step of a random
Llama-shaped model at batch 1 (tree mask, target forward over the tree, verification, KV compaction,
the step's one host sync, crop) with the fused path and with the twins, and the share of the step
that verification takes. Without CUDA the command says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from lookupspec.hf_compat import with_cache

__all__ = ["configure", "run"]

# Llama-shaped configurations for the decode-step timing (random weights).
E2E_MODELS: dict[str, dict[str, Any]] = {
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True),
    "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=128256, tie_word_embeddings=False),
    "tiny": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, vocab_size=49152, tie_word_embeddings=True),
}
MODES = ("greedy", "match", "match-filtered", "rejection")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, default=None, metavar="OUT", help="write all results as JSON")
    parser.add_argument("--batches", default="1,8,64", help="requests per batch")
    parser.add_argument("--nodes", default="1,8,32", help="draft nodes per request")
    parser.add_argument("--vocabs", default="49152,128256", help="vocabulary sizes")
    parser.add_argument("--dtypes", default="float16,bfloat16", help="logits dtypes")
    parser.add_argument("--modes", default="greedy,match",
                        help=f"from {','.join(MODES)} (match-filtered: top-k 50, top-p 0.9)")
    parser.add_argument("--runs", type=int, default=50, help="timed runs per configuration")
    parser.add_argument("--warmup", type=int, default=5, help="untimed runs first (compilation)")
    parser.add_argument("--e2e-model", default="llama-1b", choices=sorted(E2E_MODELS),
                        help="Llama shape for the decode-step timing")
    parser.add_argument("--e2e-prefix", type=int, default=1024, help="tokens in the KV cache")
    parser.add_argument("--e2e-nodes", default="8,32", help="draft tree sizes for the decode step")
    parser.add_argument("--no-e2e", action="store_true", help="skip the decode-step timing")
    parser.add_argument("--quick", action="store_true", help="a few small configurations (smoke test)")


def _median_ms(fn: Any, runs: int, warmup: int) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _batch_inputs(batch: int, nodes: int, vocab: int, dtype: Any, mode: str, seed: int) -> dict[str, Any]:
    """Random logits, random trees (chains in rejection mode) whose nodes copy their parent row's argmax
    with probability 0.7, and the sampling tensors of ``mode``."""
    import torch
    from lookupspec.kernels import pack_requests

    from lookupspec.sampling import SamplingParams

    gen = torch.Generator(device="cuda").manual_seed(seed)
    rows = batch * (nodes + 1)
    logits = (torch.randn(rows, vocab, device="cuda", generator=gen) * 3).to(dtype)
    argmax = logits.argmax(-1).view(batch, nodes + 1).tolist()
    params = {
        "greedy": SamplingParams(),
        "match": SamplingParams(temperature=0.8, seed=seed),
        "match-filtered": SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=seed),
        "rejection": SamplingParams(temperature=0.8, seed=seed),
    }[mode]
    cpu = torch.Generator().manual_seed(seed)
    trees = []
    for b in range(batch):
        if mode == "rejection":
            parents = list(range(-1, nodes - 1))
        else:
            parents = [int(torch.randint(-1, i, (1,), generator=cpu)) if i else -1 for i in range(nodes)]
        tokens = [argmax[b][p + 1] if bool(torch.rand(1, generator=cpu) < 0.7)
                  else int(torch.randint(vocab, (1,), generator=cpu)) for p in parents]
        trees.append((tokens, parents))
    packed = pack_requests(trees, [params] * batch, [100 + b for b in range(batch)], device="cuda")
    draft_probs = None
    if mode == "rejection":
        draft_probs = torch.softmax(torch.randn(batch * nodes, vocab, device="cuda", generator=gen), -1)
    return dict(logits=logits, draft_probs=draft_probs,
                mode="match" if mode.startswith("match") else mode, **packed._asdict())


def _kernel_table(args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch
    from lookupspec.kernels import reference, verify_triton

    rows: list[dict[str, Any]] = []
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for vocab in _ints(args.vocabs):
            for mode in args.modes.split(","):
                for batch in _ints(args.batches):
                    for nodes in _ints(args.nodes):
                        kw = _batch_inputs(batch, nodes, vocab, dtype, mode, seed=len(rows) + 1)
                        fused = verify_triton.verify_batch(**kw)
                        twin = reference.verify_batch(**kw)
                        equal = all(torch.equal(a, b) for a, b in zip(fused, twin, strict=True))
                        fused_ms = _median_ms(lambda kw=kw: verify_triton.verify_batch(**kw),
                                              args.runs, args.warmup)
                        twin_ms = _median_ms(lambda kw=kw: reference.verify_batch(**kw),
                                             max(5, args.runs // 5), 2)
                        row = dict(mode=mode, dtype=dtype_name, vocab=vocab, batch=batch, nodes=nodes,
                                   fused_ms=round(fused_ms, 4), twin_ms=round(twin_ms, 4),
                                   speedup=round(twin_ms / fused_ms, 2), identical=equal)
                        rows.append(row)
                        print(f"{mode:>14} {dtype_name:>8} V={vocab:<6} B={batch:<3} n={nodes:<3} "
                              f"fused {fused_ms:8.3f} ms  twin {twin_ms:8.3f} ms  x{row['speedup']:<6} "
                              f"{'identical' if equal else 'DIFFERENT'}", flush=True)
                        del kw
                        torch.cuda.empty_cache()
    return rows


def _decode_step(model: Any, config: Any, prefix: Any, nodes: int, mode: str, params: Any,
                 args: argparse.Namespace, gen: Any) -> dict[str, Any]:
    """Median time of one batch-1 speculative step over a random tree, fused path vs twins."""
    import torch
    import transformers
    from lookupspec.kernels import compact_cache, pack_requests, tree_mask, verify_batch

    dtype = model.dtype
    vocab = config.vocab_size
    p_len = prefix.shape[1]
    parents = [int(torch.randint(-1, i, (1,), generator=gen)) if i else -1 for i in range(nodes)]
    tokens = torch.randint(vocab, (nodes,), generator=gen).tolist()
    fwd_parents = torch.tensor([-1] + [p + 1 for p in parents], device="cuda")
    ids = torch.tensor([[0, *tokens]], device="cuda")
    packed = pack_requests([(tokens, parents)], [params], [p_len], device="cuda")._asdict()
    cache = transformers.DynamicCache(config=config)
    with torch.no_grad():
        model(input_ids=prefix, **with_cache(model, cache))

    def tree_logits(backend: str) -> Any:
        mask, pos = tree_mask(fwd_parents, p_len, dtype, backend=backend)
        return model(input_ids=ids, attention_mask=mask, position_ids=pos,
                     **with_cache(model, cache)).logits[0]

    def step(backend: str) -> int:
        with torch.no_grad():
            out = verify_batch(tree_logits(backend), **packed, mode=mode, backend=backend)
            compact_cache(cache, out.accepted, out.num_accepted, p_len + 1, backend=backend)
            accepted = int(out.num_accepted[0])  # the step's one host sync, as in the engine
            cache.crop(-(nodes - accepted))
        return accepted

    def timed(backend: str) -> float:
        times = []
        for i in range(args.warmup + args.runs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            accepted = step(backend)
            end.record()
            end.synchronize()
            cache.crop(-(1 + accepted))  # back to the prefix (untimed)
            if i >= args.warmup:
                times.append(start.elapsed_time(end))
        return statistics.median(times)

    fused_ms, twin_ms = timed("triton"), timed("torch")
    with torch.no_grad():
        logits = tree_logits("triton")
        cache.crop(-(nodes + 1))
    verify_ms = _median_ms(lambda: verify_batch(logits, **packed, mode=mode, backend="triton"),
                           args.runs, args.warmup)
    return dict(model=args.e2e_model, prefix=p_len, nodes=nodes, mode=mode,
                step_fused_ms=round(fused_ms, 3), step_twin_ms=round(twin_ms, 3),
                verify_fused_ms=round(verify_ms, 4), verify_share_of_step=round(verify_ms / fused_ms, 4))


def _decode_step_table(args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch
    import transformers

    from lookupspec.sampling import SamplingParams

    config = transformers.LlamaConfig(max_position_embeddings=args.e2e_prefix + 512,
                                      rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                                      **E2E_MODELS[args.e2e_model])
    with torch.device("cuda"):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).bfloat16().eval()
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(config.vocab_size, (1, args.e2e_prefix), generator=gen).cuda()
    rows = []
    for nodes in _ints(args.e2e_nodes):
        for mode, params in (("greedy", SamplingParams()), ("match", SamplingParams(0.8, seed=1))):
            row = _decode_step(model, config, prefix, nodes, mode, params, args, gen)
            rows.append(row)
            print(f"decode step {row['model']} prefix {row['prefix']} n={nodes:<3} {mode:>6}: "
                  f"fused {row['step_fused_ms']:.3f} ms, twin {row['step_twin_ms']:.3f} ms, verification "
                  f"{row['verify_fused_ms']:.3f} ms ({100 * row['verify_share_of_step']:.1f}% of the step)",
                  flush=True)
    return rows


def run(args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available():
        print("bench-kernels needs a CUDA GPU and none is available here: nothing to measure.")
        return 0
    import triton

    if args.quick:
        args.batches, args.nodes, args.vocabs, args.dtypes = "1,8", "8", "49152", "bfloat16"
        args.modes, args.runs, args.warmup = ",".join(MODES), 10, 2
        args.e2e_model, args.e2e_prefix, args.e2e_nodes = "tiny", 128, "8"
    for mode in args.modes.split(","):
        if mode not in MODES:
            raise SystemExit(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    device = torch.cuda.get_device_name()
    print(f"{device}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    result: dict[str, Any] = dict(device=device, date=time.strftime("%Y-%m-%d"), torch=torch.__version__,
                                  triton=triton.__version__, kernels=_kernel_table(args))
    if not args.no_e2e:
        result["decode_step"] = _decode_step_table(args)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0
