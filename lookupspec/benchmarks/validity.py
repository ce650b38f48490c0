"""Whether a benchmark output follows its prompt's ``response_format``.

The check is independent of the grammar that constrained decoding: the output text is parsed with
``json`` and validated against the schema by a JSON Schema validator (``jsonschema-rs``, which the
``bench`` and ``test`` extras install; the pure-Python ``jsonschema`` package serves as well). A
``json_object`` output must parse as an object. Without either validator a schema check is not
possible: :func:`output_checker` then raises ``ImportError`` saying what to install, before a
benchmark runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Checker", "output_checker"]

# A check: the output text -> None when it is valid, else why not (one line).
Checker = Callable[[str], "str | None"]


def _schema_validator(schema: Mapping[str, Any]) -> Callable[[Any], str | None]:
    """The schema's validator: instance -> None when valid, else the first error. Raises ``ValueError``
    for a schema that is not a valid JSON schema, ``ImportError`` without a validator library."""
    try:
        import jsonschema_rs
    except ImportError:
        jsonschema_rs = None  # type: ignore[assignment]
    if jsonschema_rs is not None:
        try:
            v = jsonschema_rs.validator_for(dict(schema))
        except jsonschema_rs.ValidationError as exc:
            raise ValueError(f"not a valid JSON schema: {str(exc).splitlines()[0]}") from None
        return lambda doc: next((str(e).splitlines()[0] for e in v.iter_errors(doc)), None)
    try:
        import jsonschema
    except ImportError:
        raise ImportError("checking outputs against their schemas needs a JSON Schema validator: "
                          "pip install jsonschema-rs (the bench and test extras include it)") from None
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"not a valid JSON schema: {exc.message}") from None
    checker = cls(schema)
    return lambda doc: next((e.message for e in checker.iter_errors(doc)), None)


def output_checker(response_format: Mapping[str, Any] | None) -> Checker | None:
    """The check of outputs asked for with ``response_format`` (OpenAI's shape, as
    :func:`lookupspec.benchmarks.prompts.check_response_format` leaves it); None for free text.
    Example: a schema ``{"type": "object", "required": ["a"]}`` makes ``'{"a": 1}'`` valid and
    ``'{"b": 1}'`` invalid ("'a' is a required property")."""
    if response_format is None or response_format.get("type", "text") == "text":
        return None
    validate = None
    if response_format["type"] == "json_schema":
        validate = _schema_validator(response_format["json_schema"]["schema"])

    def check(text: str) -> str | None:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            return f"not JSON: {exc.msg} at character {exc.pos}"
        if validate is None:
            return None if isinstance(doc, dict) else "not a JSON object"
        return validate(doc)

    return check
