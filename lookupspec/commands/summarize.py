"""Summarize many documents with speculation: a JSONL file (one {"id", "text"} object per line) or a
directory of .txt/.md files in, one JSON line per finished document out (id, summary, usage,
speculation statistics, timings).

Resumable: a rerun skips the ids already in the output, and a run cut short (Ctrl-C, SIGTERM, kill -9)
leaves a valid output file (a torn last line is cut off on the next start). A bad input line is
reported with its line number and skipped (--strict aborts instead). Runs the model in this process,
or sends requests to a `lookupspec serve` gateway with --gateway; either way --concurrency requests are
in flight, batched into the same decode steps.
Prints a report at the end: totals, acceptance length and the speedup over plain decoding, measured
against the first --plain-sample documents decoded again without speculation in the same run (see
lookupspec.summarize.speedup). --plot needs matplotlib, checked before the job starts; the chart covers
every document in the output file, so a rerun with nothing left to do still writes it.

--collection NAME drafts from that document collection as well. Over a gateway it must exist there.
In-process collections live only as long as the job, so the job first indexes the input documents
themselves into NAME: each summary may then draft from every input document, which pays when
documents share text (boilerplate, templates, quoted passages).

Exit status: 0 all done; 1 some documents failed or bad input entries were skipped; 2 the job could
not run (unreadable input, bad template, model or gateway error, --strict); 130 / 143 interrupted by
SIGINT / SIGTERM (the output holds every finished document; rerun to resume)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from lookupspec.commands.common import (
    add_model_arguments,
    engine_config,
    model_config,
    non_negative_int,
    positive_int,
)

_EXIT_FAILURES, _EXIT_ERROR = 1, 2


def configure(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("input", type=Path, help="JSONL file of documents, or a directory of .txt/.md files")
    a("-o", "--output", type=Path, required=True, help="JSONL file the summaries are appended to")
    add_model_arguments(parser)
    # unset: LOOKUPSPEC_MODEL or the default model in-process, the gateway's own model with --gateway
    parser.set_defaults(model=None)
    a("--draft-model", default=os.environ.get("LOOKUPSPEC_DRAFT_MODEL") or None,
      help="in-process draft model (same tokenizer) or self:layers=K [env LOOKUPSPEC_DRAFT_MODEL]")
    a("--text-field", default="text", help="JSONL field holding the document text")
    a("--id-field", default="id", help="JSONL field holding the document id (missing: the line number)")
    a("--prompt-template", type=Path, default=None, metavar="FILE",
      help="user message with a {text} placeholder (unset: a built-in system + 'Summarize ...' prompt)")
    a("--max-tokens", type=positive_int, default=256, help="maximum summary tokens")
    a("--json-schema", type=Path, default=None, metavar="FILE",
      help="structured summaries: a JSON schema file every summary follows (the record's 'data' holds it)")
    a("--collection", default=None, metavar="NAME",
      help="also draft from this collection (in-process: the input documents are indexed into it)")
    a("--gateway", default=None, metavar="URL", help="send requests to this lookupspec gateway")
    # read at run time, so --help never prints a key
    a("--api-key", default=None, help="the gateway's API key [env LOOKUPSPEC_API_KEY]")
    a("--concurrency", type=positive_int, default=4,
      help="requests in flight (in process they are batched into the same decode steps, like the gateway's)")
    a("--strict", action="store_true", help="abort on the first bad input entry instead of skipping it")
    a("--limit", type=non_negative_int, default=None, help="summarize at most this many documents this run")
    a("--plain-sample", type=non_negative_int, default=1, metavar="N",
      help="decode the first N documents a second time without speculation, to measure the speedup "
           "over plain decoding in this run (0: no speedup figure)")
    a("--plot", type=Path, default=None, metavar="OUT.png",
      help="write a chart of per-document tokens/s and acceptance length (needs matplotlib)")
    a("--progress", action=argparse.BooleanOptionalAction, default=None,
      help="progress bar on standard error (unset: when it is a terminal)")


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return _EXIT_ERROR


def _missing_optional_dependencies(args: argparse.Namespace) -> str | None:
    """What the requested options need that is not installed, with the install hint; checked before
    the job starts, so a long job does not fail at its end."""
    if args.plot is None:
        return None
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return ("--plot needs matplotlib, which is not installed: pip install matplotlib (make "
                "install-test includes it), or run without --plot")
    return None


def run(args: argparse.Namespace) -> int:
    from lookupspec.client import ClientError
    from lookupspec.models import ModelLoadError
    from lookupspec.summarize.inputs import Document, read_documents
    from lookupspec.summarize.interrupts import Interrupts, JobInterrupted
    from lookupspec.summarize.job import FatalError, JobConfig, plan, run_job
    from lookupspec.summarize.outputs import OutputFile
    from lookupspec.summarize.prompt import DEFAULT_TEMPLATE, PromptTemplate
    from lookupspec.summarize.report import JobReport

    def log(message: str) -> None:
        print(message, file=sys.stderr)

    missing = _missing_optional_dependencies(args)
    if missing:
        return _error(missing)
    try:
        template = DEFAULT_TEMPLATE
        if args.prompt_template is not None:
            template = PromptTemplate.from_file(args.prompt_template)
    except (OSError, ValueError) as exc:
        return _error(f"--prompt-template: {exc}")
    schema = None
    if args.json_schema is not None:
        try:
            schema = json.loads(args.json_schema.read_text())
        except (OSError, ValueError) as exc:
            return _error(f"--json-schema: {exc}")
        if not isinstance(schema, dict):
            return _error("--json-schema: the file must hold a JSON object (a JSON schema)")
    config = JobConfig(max_tokens=args.max_tokens, template=template, collection=args.collection,
                       json_schema=schema,
                       concurrency=args.concurrency, strict=args.strict,
                       limit=args.limit, plain_sample=args.plain_sample, log=log,
                       progress=sys.stderr.isatty() if args.progress is None else args.progress)
    report = JobReport()
    try:
        out, recovery = OutputFile.open(args.output)
    except OSError as exc:
        return _error(f"cannot open the output: {exc}")
    client: Any = None
    status = 0
    with out:
        if recovery.truncated_bytes:
            log(f"{args.output}: cut off a torn last line ({recovery.truncated_bytes} bytes)")
        for number in recovery.bad_lines:
            log(f"warning: {args.output}:{number} is not a result line; left as it is")
        try:
            items = list(read_documents(args.input, text_field=args.text_field, id_field=args.id_field))
            docs = plan(items, recovery.done, config, report)
        except OSError as exc:
            return _error(f"cannot read {args.input}: {exc}")
        except FatalError as exc:
            return _error(str(exc))
        if docs:
            with Interrupts() as interrupts:
                try:
                    client = _connect(args, log)
                    if args.collection and args.gateway is None:
                        indexed = [{"id": d.id, "text": d.text} for d in items if isinstance(d, Document)]
                        n = client.add_documents(args.collection, indexed)
                        log(f"indexed {n} input documents into the in-process collection {args.collection!r}")
                    run_job(client, docs, out, config, report, interrupts)
                except JobInterrupted as exc:
                    report.interrupted = str(exc)
                    status = exc.exit_status
                except (FatalError, ClientError, ModelLoadError) as exc:
                    status = _error(str(exc))
    # outside Interrupts: a second Ctrl-C while the report prints ends the process the usual way
    finish_status = _finish(report, client, args)
    status = status or finish_status
    if status:
        return status
    return _EXIT_FAILURES if report.failures or report.bad_inputs else 0


def _connect(args: argparse.Namespace, log: Any) -> Any:
    from lookupspec.client import GatewayClient, connect
    from lookupspec.models import DEFAULT_MODEL

    if args.gateway:
        api_key = args.api_key or os.environ.get("LOOKUPSPEC_API_KEY") or None
        client = GatewayClient(args.gateway, api_key=api_key, model=args.model)
        log(f"gateway {client.base_url}, model {client.model}")  # fails fast when it is unreachable
        return client
    model = args.model or os.environ.get("LOOKUPSPEC_MODEL") or DEFAULT_MODEL
    log(f"loading model {model} ...")  # seconds of silence otherwise (torch import, load, warm-up)
    # warmup seeds the cost model the drafting policy relies on
    return connect(model, config=model_config(args), engine=engine_config(args), warmup=True, log=log)


def _finish(report: Any, client: Any, args: argparse.Namespace) -> int:
    """Print the report (standard output), write the plot, close the client. Returns an exit status
    (0, or 2 when the plot could not be written)."""
    from lookupspec.summarize.outputs import read_records

    status = 0
    try:
        # the whole output file: the plot and the report's "output:" line cover earlier runs too
        records = read_records(args.output) if args.plot is not None or report.skipped_done else []
        print(report.text(records, str(args.output)), flush=True)
        if args.plot is not None:
            if records:
                print(f"plot: {report.plot(args.plot, records)}", flush=True)
            else:
                print(f"plot: not written, {args.output} holds no summaries yet", flush=True)
    except OSError as exc:
        status = _error(f"cannot write the plot (the summaries are in {args.output}; rerun to retry): {exc}")
    finally:
        if client is not None:
            client.close()
    return status
