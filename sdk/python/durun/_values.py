"""Values: what a step may take and return, and a request as a line."""

import datetime
import json
import sys
from typing import Any, Callable, Dict, Optional, Tuple, Union


_warned_tuples: "set[str]" = set()

#: What a value is, for an error about it: the words, or a format and the
#: name it takes (formatted only for the error: a step's hot path should
#: not pay for a message it never shows).
Where = Union[str, Tuple[str, str]]


def _said(where: Where) -> str:
    return where if isinstance(where, str) else where[0] % (where[1],)


#: Values stored as they are (exactly these types; subclasses, such as an
#: IntEnum, take the longer way below to the same result).
_SCALARS = frozenset((str, int, float, bool, type(None)))


def _encode(value: Any, where: Where) -> Any:
    """``value`` as JSON data, by the module's documented rules; TypeError
    naming ``where`` and the type for anything else."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is dict:
        # The common case, a dict of plain values, without a call per item.
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                return _encode_any(value, where)
            out[key] = item if type(item) in _SCALARS else _encode(item, where)
        return out
    return _encode_any(value, where)


def _encode_any(value: Any, where: Where) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"durun: {_said(where)} holds a dict key of type {type(key).__name__}; JSON keys are strings")
            out[key] = _encode(item, where)
        return out
    if isinstance(value, list):
        return [_encode(item, where) for item in value]
    if isinstance(value, tuple):
        said = _said(where)
        if said not in _warned_tuples:
            _warned_tuples.add(said)
            sys.stderr.write(f"durun: {said} holds a tuple; it is stored as a list, and a replay gives a list\n")
        return [_encode(item, where) for item in value]
    # dataclasses.is_dataclass, without importing dataclasses (milliseconds
    # of a start) for a script that has none.
    if hasattr(type(value), "__dataclass_fields__") and not isinstance(value, type):
        import dataclasses

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
        f"durun: {_said(where)} holds a {type(value).__module__}.{type(value).__qualname__}, which durun cannot journal: "
        "use JSON values (dict, list, str, number, bool, None), a dataclass, a pydantic model or a datetime, "
        "or convert it yourself (durun never pickles)")


def _make_dumps(canonical: bool = False) -> Callable[[Any], str]:
    """``json.dumps(value, allow_nan=False, ensure_ascii=False)`` with its
    encoder made once: ``json.dumps`` with options builds a new one for
    every call, which costs more than encoding a request. With
    ``canonical``, ``json.dumps(value, sort_keys=True, allow_nan=False)``:
    the args as durun's keys hash them. The C encoder is used directly
    where this Python has it and it encodes as the Python one does; else
    the Python one."""
    encoder = json.JSONEncoder(allow_nan=False, ensure_ascii=canonical, sort_keys=canonical)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is not None:
        try:
            strings = json.encoder.encode_basestring_ascii if canonical else json.encoder.encode_basestring
            # No circular check: `_encode` has copied every value already.
            fast = make(None, encoder.default, strings, None, ": ", ", ", canonical, False, False)
            sample = {"b": [1, 2.5, None, True, "\u00e9\n\"\U0001f600"], "a": {"c": -0.0, "B": 1e16}}
            if "".join(fast(sample, 0)) == encoder.encode(sample):
                return lambda value: "".join(fast(value, 0))
        except Exception:  # another Python's private API: the public one then
            pass
    return encoder.encode


_dumps = _make_dumps()
_canonical = _make_dumps(canonical=True)
_string: Callable[[str], str] = json.encoder.encode_basestring


def _line(message: Dict[str, Any], what: Optional[str] = None) -> bytes:
    """The request as one protocol line (UTF-8), or ValueError before
    anything is sent: NaN, Infinity and lone surrogates cannot be journaled
    as JSON."""
    try:
        line = _dumps(message).encode("utf-8")
    except ValueError as exc:
        what = what or message.get("name") or message.get("tool") or message.get("op")
        if isinstance(exc, UnicodeEncodeError):
            problem = "a string with a lone surrogate (bytes that are not text; encode them, e.g. base64)"
        else:
            problem = "NaN or Infinity (not JSON; send None, a number or a string)"
        raise ValueError(f"durun: the {message.get('op')} of {what!r} holds {problem}") from exc
    return line + b"\n"


# A step's two messages, their envelopes written here: one call of the
# encoder costs more than the small values it encodes, so only the values
# go through it (callgrind: 5,000 fewer instructions a message). Anything
# unusual takes `_line`, which also words the errors.
_BEGIN = '{"op":"begin","name":%s,"args":%s,"effect":%s}\n'
_COMMIT = '{"op":"commit","%s":%d,"output":%s,"usage":%s}\n'


def _begin_line(name: str, args: Any, effect: str) -> bytes:
    """The line of a step's `begin` (args as `_encode` gave them)."""
    try:
        return (_BEGIN % (_string(name), _dumps(args), _string(effect))).encode("utf-8")
    except (TypeError, ValueError):
        return _line({"op": "begin", "name": name, "args": args, "effect": effect})


def _commit_line(name: str, closes: str, number: int, output: Any, usage: Optional[Dict[str, Any]]) -> bytes:
    """The line of the `commit` of step ``name``, which names it by
    ``closes`` (``"step"``, or ``"begin"``: the id of its posted `begin`)."""
    try:
        return (_COMMIT % (closes, number, _dumps(output), "null" if usage is None else _dumps(usage))).encode("utf-8")
    except (TypeError, ValueError):
        return _line({"op": "commit", closes: number, "output": output, "usage": usage}, name)
