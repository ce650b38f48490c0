"""Generate text for one prompt and stream it to the terminal as it is produced.

Greedy by default; --temperature > 0 samples (reproducibly with --seed). --chat renders the prompt
as a user message with the model's chat template. Speculation (lookup drafts from the prompt, and a
draft model with --draft-model) is on unless --no-spec; the output is the same either way. -v prints
the speculation statistics afterwards."""

from __future__ import annotations

import argparse
import sys
import time

from lookupspec.commands.common import add_model_arguments, positive_int
from lookupspec.models import ModelLoadError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="prompt text ('-' reads it from standard input)")
    add_model_arguments(parser)
    parser.add_argument("--max-tokens", type=positive_int, default=256, help="maximum new tokens")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    parser.add_argument("--top-k", type=int, default=0, help="sample among the k most likely (0 = off)")
    parser.add_argument("--seed", type=int, default=None, help="seed for reproducible sampling")
    parser.add_argument("--stop", action="append", default=[],
                        help="stop string (repeatable); in bash, $'\\n\\n' is a blank line ('\\n' is a "
                             "backslash and an n)")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    parser.add_argument("--draft-model", default=None,
                        help="draft model sharing the target's tokenizer, or self:layers=K / self:int8")
    parser.add_argument("--no-spec", action="store_true", help="plain decoding (no speculation)")
    parser.add_argument("--max-draft-tokens", type=int, default=32, help="draft tree node budget per step")
    parser.add_argument("-v", "--verbose", action="store_true", help="print speculation statistics")


def run(args: argparse.Namespace) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    for stop in args.stop:
        if "\\n" in stop and "\n" not in stop:
            print(f"note: --stop {stop!r} is a backslash and an n, not a newline; in bash write "
                  "$'\\n' for a newline", file=sys.stderr)
    # Importing torch and loading the model take seconds: say so first, on stderr (stdout is the text).
    print(f"loading model {args.model} ...", file=sys.stderr, flush=True)
    from lookupspec.client import ClientError, GenerationRequest, LocalClient, Lookup
    from lookupspec.text import TextEngine

    try:
        te = TextEngine.load(args.model, draft_model=args.draft_model, dtype=args.dtype, device=args.device,
                             packed_linear=args.packed_linear, lean_forward=args.lean_forward, auto_pull=True,
                             warmup=not args.no_spec,
                             log=lambda m: print(m, file=sys.stderr))
    except (ModelLoadError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = {"messages": [{"role": "user", "content": prompt}]} if args.chat else {"prompt": prompt}
    lookup = Lookup(enabled=not args.no_spec, max_draft_tokens=args.max_draft_tokens)
    request = GenerationRequest(**text, max_tokens=args.max_tokens, temperature=args.temperature,
                                top_p=args.top_p, top_k=args.top_k, seed=args.seed, stop=tuple(args.stop),
                                lookup=lookup)
    last = None
    t0 = time.perf_counter()
    with LocalClient(te, model=args.model) as client:
        try:
            for delta in client.stream(request):
                sys.stdout.write(delta.text)
                sys.stdout.flush()
                last = delta
        except ClientError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    seconds = time.perf_counter() - t0
    sys.stdout.write("\n")
    print(f"[finish_reason: {last.finish_reason if last else None}]", file=sys.stderr)
    if args.verbose and last is not None and last.speculation:
        d, tokens = last.speculation, (last.usage or {}).get("completion_tokens", 0)
        print(f"[{tokens} tokens in {seconds:.2f} s = {tokens / seconds:.1f} tokens/s; "
              f"{d['steps']} target forwards; acceptance length {d['acceptance_length']:.2f}; "
              f"draft tokens {d['draft_tokens']}, accepted {d['accepted_tokens']}; "
              f"sources {d['accepted_tokens_by_source']}]", file=sys.stderr)
    return 0
