"""The generation service both front ends run: the gateway (``lookupspec serve``) and the in-process
client (``lookupspec.connect(model)``).

A ``Service`` holds the text engine, the store (the persistence log of documents and outputs) and this
process's token indexes built from it, and runs every request through one scheduler loop:
``planning.plan`` turns a ``JobRequest`` into a validated ``GenerationJob``, ``Service.submit`` queues
it and returns a ``Ticket`` whose events (text, finished choices, the end) the caller reads;
``accounting`` builds the ``usage`` and ``speculation`` objects both front ends report.
"""

from __future__ import annotations

from .config import DEFAULT_NAMESPACE, Limits, ServiceConfig
from .errors import ServiceError
from .jobs import ChoiceFinished, GenerationJob, JobDone, JobFailed, TextDelta, Ticket
from .planning import JobRequest, Lookup, plan
from .service import Service, build_service

__all__ = [
    "DEFAULT_NAMESPACE",
    "ChoiceFinished",
    "GenerationJob",
    "JobDone",
    "JobFailed",
    "JobRequest",
    "Limits",
    "Lookup",
    "Service",
    "ServiceConfig",
    "ServiceError",
    "TextDelta",
    "Ticket",
    "build_service",
    "plan",
]
