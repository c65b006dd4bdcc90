"""``durun.wrap(client)``: every model call of an OpenAI or Anthropic
client becomes a journaled ``read`` step, with its token usage.

Duck-typed: neither package is imported. The calls journaled are
``chat.completions.create`` and ``responses.create`` (OpenAI, ``AsyncOpenAI``)
and ``messages.create`` (Anthropic, ``AsyncAnthropic``); everything else on
the client passes through untouched. A call's keyword arguments are the
step's args (keep volatile values out of them). What comes back, on the
first run and on a replay alike, is the response as the journal holds it:
an object whose attributes and items are the response's fields
(``reply.choices[0].message.content``, ``message.content[0].text``,
``response.output_text``), with ``model_dump()`` for the dict. A stream
(``stream=True``) is consumed inside the step, journaled chunk by chunk,
and handed back as an iterator (async iterator for async clients) over
the same chunks.
"""

import inspect
from typing import Any, AsyncIterator, Dict, Iterator, List, Optional, Tuple

from . import _arun_step, _run_step, usage

_ENDPOINTS = {("chat", "completions", "create"), ("responses", "create"), ("messages", "create")}


def wrap(client: Any, provider: Optional[str] = None) -> Any:
    """Journals the model calls of ``client`` (OpenAI or Anthropic, sync or
    async). Steps are named ``PROVIDER.PATH``, like
    ``openai.chat.completions.create``; ``provider`` defaults to the
    client's package name."""
    name = provider or type(client).__module__.split(".")[0]
    # The clients' own methods hide behind decorators that are not
    # coroutine functions: the client's class says which kind it is.
    is_async = type(client).__name__.startswith("Async")
    return _Proxy(client, (), name, is_async)


class _Proxy:
    """The client, or a resource on the way to a journaled endpoint."""

    def __init__(self, target: Any, path: Tuple[str, ...], provider: str, is_async: bool) -> None:
        self._target = target
        self._path = path
        self._provider = provider
        self._async = is_async

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._target, attr)
        path = self._path + (attr,)
        if path in _ENDPOINTS and callable(value):
            name = f"{self._provider}.{'.'.join(path)}"
            return _journaled(value, name, self._async or inspect.iscoroutinefunction(value))
        if any(endpoint[:len(path)] == path for endpoint in _ENDPOINTS):
            return _Proxy(value, path, self._provider, self._async)
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


def _journaled(create: Any, name: str, is_async: bool) -> Any:
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
                return _AStream(recorded["stream"])
            return _view(recorded)

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
            return _Stream(recorded["stream"])
        return _view(recorded)

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
        self._chunks = [_view(chunk) for chunk in chunks]

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
