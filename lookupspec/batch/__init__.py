"""Batch jobs over many documents (``lookupspec summarize``).

``inputs`` reads documents (JSONL or a folder), ``outputs`` is the kill-safe append-only result file,
``summarize`` runs the job, ``report`` aggregates it, ``speedup`` measures the speedup over plain
decoding against a plain-decoding sample of the same run.
"""

from lookupspec.batch.inputs import BadInput, Document, read_documents
from lookupspec.batch.interrupts import Interrupts, JobInterrupted
from lookupspec.batch.outputs import OutputFile, Recovery, read_records
from lookupspec.batch.prompt import DEFAULT_TEMPLATE, PromptTemplate
from lookupspec.batch.report import JobReport
from lookupspec.batch.speedup import PlainSample, Speedup, measure_speedup
from lookupspec.batch.summarize import FatalError, JobConfig, plain_sample, plan, run_job, summarize_one

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
