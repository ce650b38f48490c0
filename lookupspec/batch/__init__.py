"""Batch jobs over many documents (``lookupspec summarize``).

``inputs`` reads documents (JSONL or a folder), ``outputs`` is the kill-safe append-only result file,
``summarize`` runs the job, ``report`` aggregates it, ``speedup`` holds the speedup-estimate formulas.
"""

from lookupspec.batch.inputs import BadInput, Document, read_documents
from lookupspec.batch.interrupts import Interrupts, JobInterrupted
from lookupspec.batch.outputs import OutputFile, Recovery
from lookupspec.batch.prompt import DEFAULT_TEMPLATE, PromptTemplate
from lookupspec.batch.report import JobReport
from lookupspec.batch.summarize import FatalError, JobConfig, plan, run_job, summarize_one

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
    "PromptTemplate",
    "Recovery",
    "plan",
    "read_documents",
    "run_job",
    "summarize_one",
]
