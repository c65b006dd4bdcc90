"""Values: what a step may take and return, and a request as a line."""

import dataclasses
import datetime
import json
import sys
from typing import Any, Dict


_warned_tuples: "set[str]" = set()


def _encode(value: Any, where: str) -> Any:
    """``value`` as JSON data, by the module's documented rules; TypeError
    naming ``where`` and the type for anything else."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"durun: {where} holds a dict key of type {type(key).__name__}; JSON keys are strings")
            out[key] = _encode(item, where)
        return out
    if isinstance(value, list):
        return [_encode(item, where) for item in value]
    if isinstance(value, tuple):
        if where not in _warned_tuples:
            _warned_tuples.add(where)
            sys.stderr.write(f"durun: {where} holds a tuple; it is stored as a list, and a replay gives a list\n")
        return [_encode(item, where) for item in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _encode(dataclasses.asdict(value), where)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    dump = getattr(value, "model_dump", None)
    if callable(dump):  # pydantic v2, and the OpenAI and Anthropic clients' types
        return _encode(dump(mode="json"), where)
    legacy = getattr(value, "dict", None)
    if callable(legacy) and hasattr(value, "__fields__"):  # pydantic v1
        return _encode(legacy(), where)
    raise TypeError(
        f"durun: {where} holds a {type(value).__module__}.{type(value).__qualname__}, which durun cannot journal: "
        "use JSON values (dict, list, str, number, bool, None), a dataclass, a pydantic model or a datetime, "
        "or convert it yourself (durun never pickles)")


def _line(message: Dict[str, Any]) -> bytes:
    """The request as one protocol line (UTF-8), or ValueError before
    anything is sent: NaN, Infinity and lone surrogates cannot be journaled
    as JSON."""
    try:
        line = json.dumps(message, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except ValueError as exc:
        what = message.get("name") or message.get("tool") or message.get("op")
        if isinstance(exc, UnicodeEncodeError):
            problem = "a string with a lone surrogate (bytes that are not text; encode them, e.g. base64)"
        else:
            problem = "NaN or Infinity (not JSON; send None, a number or a string)"
        raise ValueError(f"durun: the {message.get('op')} of {what!r} holds {problem}") from exc
    return line + b"\n"
