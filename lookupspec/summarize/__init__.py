"""Batch jobs over many documents (``lookupspec summarize``).

``inputs`` reads documents (JSONL or a folder), ``outputs`` is the kill-safe append-only result file,
``summarize`` runs the job, ``report`` aggregates it, ``speedup`` measures the speedup over plain
decoding against a plain-decoding sample of the same run.
"""

from lookupspec.summarize.inputs import BadInput, Document, read_documents
from lookupspec.summarize.interrupts import Interrupts, JobInterrupted
from lookupspec.summarize.job import FatalError, JobConfig, plain_sample, plan, run_job, summarize_one
from lookupspec.summarize.outputs import OutputFile, Recovery, read_records
from lookupspec.summarize.prompt import DEFAULT_TEMPLATE, PromptTemplate
from lookupspec.summarize.report import JobReport
from lookupspec.summarize.speedup import PlainSample, Speedup, measure_speedup

__all__ = [
    "DEFAULT_TEMPLATE",
    "BadInput",
    "Document",
    "FatalError",
    "Interrupts",
    "JobConfig",
    "JobInterrupted",
    "JobReport",
    "OutputFile",
    "PlainSample",
    "PromptTemplate",
    "Recovery",
    "Speedup",
    "measure_speedup",
    "plain_sample",
    "plan",
    "read_documents",
    "read_records",
    "run_job",
    "summarize_one",
]
