"""``durun.wrap(client)``: every model call of an OpenAI or Anthropic
client becomes a journaled ``read`` step, with its token usage.

Duck-typed: neither package is imported. The calls journaled are
``chat.completions.create`` and ``responses.create`` (OpenAI, ``AsyncOpenAI``)
and ``messages.create`` (Anthropic, ``AsyncAnthropic``); everything else on
the client passes through untouched. A call's keyword arguments are the
step's args (keep volatile values out of them). What comes back, on the
first run and on a replay alike, is the client's own response type
(``ChatCompletion``, ``Response``, ``Message``), rebuilt from the recorded
JSON as the client itself builds it from an HTTP body: ``isinstance``,
``to_json()``, ``output_text`` and the rest work as without durun. A
client whose package durun does not know gets a ``Recorded`` view: the
fields as attributes and items, ``model_dump()`` for the dict. A stream
(``stream=True``) is consumed inside the step, journaled chunk by chunk,
and handed back as an iterator (async iterator for async clients) over
the same chunks, each of the client's chunk or event type.
"""

import functools
import importlib
from typing import Any, AsyncIterator, Dict, Iterator, List, Optional, Tuple

from ._steps import _arun_step, _is_async, _run_step, usage

_ENDPOINTS = {("chat", "completions", "create"), ("responses", "create"), ("messages", "create")}

# The response types of each endpoint, by the client's package: (module,
# answer type, stream chunk type). The packages build these from JSON with
# their own `_models.construct_type`, and so does durun.
_TYPES = {
    ("openai", ("chat", "completions", "create")): ("openai.types.chat", "ChatCompletion", "ChatCompletionChunk"),
    ("openai", ("responses", "create")): ("openai.types.responses", "Response", "ResponseStreamEvent"),
    ("anthropic", ("messages", "create")): ("anthropic.types", "Message", "RawMessageStreamEvent"),
}


def wrap(client: Any, provider: Optional[str] = None) -> Any:
    """Journals the model calls of ``client`` (OpenAI or Anthropic, sync or
    async). Steps are named ``PROVIDER.PATH``, like
    ``openai.chat.completions.create``; ``provider`` defaults to the
    client's package name."""
    package = type(client).__module__.split(".")[0]
    name = provider or package
    # The clients' own methods hide behind decorators that are not
    # coroutine functions: the client's class says which kind it is.
    is_async = type(client).__name__.startswith("Async")
    return _Proxy(client, (), name, is_async, package)


class _Proxy:
    """The client, or a resource on the way to a journaled endpoint."""

    def __init__(self, target: Any, path: Tuple[str, ...], provider: str, is_async: bool, package: str) -> None:
        self._target = target
        self._path = path
        self._provider = provider
        self._async = is_async
        self._package = package

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._target, attr)
        path = self._path + (attr,)
        if path in _ENDPOINTS and callable(value):
            name = f"{self._provider}.{'.'.join(path)}"
            build = _builder(self._package, path)
            return _journaled(value, name, self._async or _is_async(value), build)
        if any(endpoint[:len(path)] == path for endpoint in _ENDPOINTS):
            return _Proxy(value, path, self._provider, self._async, self._package)
        return value

    def __repr__(self) -> str:
        return f"durun.wrap({self._target!r})"


def _dump(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json", exclude_unset=False)
    return value


def _stream_usage(chunks: List[Dict[str, Any]]) -> Tuple[int, int]:
    """Input and output tokens of a stream: OpenAI's last chunk with usage
    (``stream_options={"include_usage": True}``), Anthropic's
    ``message_start`` and ``message_delta`` events."""
    tokens_in = tokens_out = 0
    for chunk in chunks:
        if not isinstance(chunk, dict):
            continue
        found = chunk.get("usage") or (chunk.get("message") or {}).get("usage")
        if not isinstance(found, dict):
            continue
        tokens_in = max(tokens_in, int(found.get("prompt_tokens") or found.get("input_tokens") or 0))
        tokens_out = max(tokens_out, int(found.get("completion_tokens") or found.get("output_tokens") or 0))
    return tokens_in, tokens_out


class _Builder:
    """Rebuilds recorded JSON as the client's own response types, or as a
    ``Recorded`` view when the package or its types cannot be found."""

    def __init__(self, package: str, path: Tuple[str, ...]) -> None:
        self._answer: Any = None
        self._chunk: Any = None
        self._construct: Any = None
        found = _TYPES.get((package, path))
        if found is None:
            return
        module, answer, chunk = found
        try:
            types = importlib.import_module(module)
            self._construct = getattr(importlib.import_module(f"{package}._models"), "construct_type")
            self._answer = getattr(types, answer)
            self._chunk = getattr(types, chunk)
        except (ImportError, AttributeError):
            self._construct = None

    def _build(self, kind: Any, value: Any) -> Any:
        if self._construct is not None and isinstance(value, dict):
            try:
                return self._construct(type_=kind, value=value)
            except Exception:  # a shape the types refuse: the view still reads it
                pass
        return _view(value)

    def answer(self, value: Any) -> Any:
        return self._build(self._answer, value)

    def chunks(self, values: List[Any]) -> List[Any]:
        return [self._build(self._chunk, value) for value in values]


@functools.lru_cache(maxsize=None)
def _builder(package: str, path: Tuple[str, ...]) -> _Builder:
    """One builder per endpoint: its types are looked up once."""
    return _Builder(package, path)


def _journaled(create: Any, name: str, is_async: bool, build: _Builder) -> Any:
    if is_async:
        async def acreate(*args: Any, **kwargs: Any) -> Any:
            if args:
                raise TypeError(f"durun: {name}() takes keyword arguments only")
            streaming = bool(kwargs.get("stream"))

            async def run() -> Any:
                response = await create(**kwargs)
                if not streaming:
                    return _dump(response)
                chunks = [_dump(chunk) async for chunk in response]
                usage(*_stream_usage(chunks))
                return {"stream": chunks}

            recorded = await _arun_step(name, kwargs, run, "read")
            if streaming:
                return _AStream(build.chunks(recorded["stream"]))
            return build.answer(recorded)

        return acreate

    def create_sync(*args: Any, **kwargs: Any) -> Any:
        if args:
            raise TypeError(f"durun: {name}() takes keyword arguments only")
        streaming = bool(kwargs.get("stream"))

        def run() -> Any:
            response = create(**kwargs)
            if not streaming:
                return _dump(response)
            chunks = [_dump(chunk) for chunk in response]
            usage(*_stream_usage(chunks))
            return {"stream": chunks}

        recorded = _run_step(name, kwargs, run, "read")
        if streaming:
            return _Stream(build.chunks(recorded["stream"]))
        return build.answer(recorded)

    return create_sync


def _view(value: Any) -> Any:
    if isinstance(value, dict):
        return Recorded(value)
    if isinstance(value, list):
        return [_view(item) for item in value]
    return value


class Recorded:
    """A response as the journal holds it: its fields as attributes and
    items; ``model_dump()`` gives the dict."""

    def __init__(self, data: Dict[str, Any]) -> None:
        object.__setattr__(self, "_data", data)

    def __getattr__(self, attr: str) -> Any:
        data: Dict[str, Any] = object.__getattribute__(self, "_data")
        if attr in data:
            return _view(data[attr])
        if attr == "output_text" and data.get("object") == "response":
            # The OpenAI client's own shortcut over a Responses API answer.
            return "".join(
                part.get("text", "")
                for item in data.get("output") or []
                for part in (item.get("content") or [])
                if isinstance(part, dict) and part.get("type") == "output_text")
        raise AttributeError(f"the recorded response has no field {attr!r}")

    def __getitem__(self, key: str) -> Any:
        return _view(object.__getattribute__(self, "_data")[key])

    def get(self, key: str, default: Any = None) -> Any:
        return _view(object.__getattribute__(self, "_data").get(key, default))

    def model_dump(self, **_: Any) -> Dict[str, Any]:
        return dict(object.__getattribute__(self, "_data"))

    def __eq__(self, other: object) -> bool:
        mine = object.__getattribute__(self, "_data")
        return bool(mine == (other.model_dump() if isinstance(other, Recorded) else other))

    def __repr__(self) -> str:
        return f"Recorded({object.__getattribute__(self, '_data')!r})"


class _Stream:
    """A consumed stream, replayed chunk by chunk."""

    def __init__(self, chunks: List[Any]) -> None:
        self._chunks = chunks

    def __iter__(self) -> Iterator[Any]:
        return iter(self._chunks)

    def __enter__(self) -> "_Stream":
        return self

    def __exit__(self, *_: Any) -> None:
        return None

    def close(self) -> None:
        return None


class _AStream(_Stream):
    """A consumed async stream, replayed chunk by chunk."""

    def __aiter__(self) -> AsyncIterator[Any]:
        async def chunks() -> AsyncIterator[Any]:
            for chunk in self._chunks:
                yield chunk

        return chunks()

    async def __aenter__(self) -> "_AStream":
        return self

    async def __aexit__(self, *_: Any) -> None:
        return None
