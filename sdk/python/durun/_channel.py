"""The channel: requests out on the real stdout, answers in on stdin,
shared by threads and an event loop."""

import itertools
import json
import os
import re
import select
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, cast

from ._ahead import _Ahead
from ._types import Answer
from ._errors import _error
from ._values import _line

# asyncio is imported where a coroutine needs it: an async step runs in an
# event loop, so it is loaded by then, and a script without one is spared
# its import (tens of milliseconds of a start).
if TYPE_CHECKING:
    import asyncio


# The channel: requests out on the real stdout, answers in on stdin.

#: How long a reader looks for an answer before it sleeps (seconds): an
#: answer durun gives from memory (a `read` step's begin, a replayed step)
#: comes within a round trip; one that waits for a commit (a `mutate`
#: step's begin), within an fsync. Sleeping and being woken costs tens of
#: microseconds on many machines (more on a VM, whose idle core halts).
_SPIN = 50e-6
_SPIN_DURABLE = 1e-3

#: One wait in this many spins the whole cap, whatever the budget.
_PROBE = 16

#: Posted requests left unanswered before a post waits for the oldest:
#: their answers must not fill the pipe durun writes them to.
_MAX_POSTED = 1024

#: Posts between two reads of the answers that came: a few kilobytes of
#: them, far below what durun lets an agent leave unread.
_READ_EVERY = 128

#: Each line of a chunk of answers, as durun writes them: one that
#: committed a step (group 3 `_COMMITTED`) or opened a new one, read
#: without `json.loads` (groups 1-3), or any other.
_COMMITTED = b"}\n"
_ANSWERS = re.compile(rb'\{"id":(\d+),"ok":true,"step":(\d+)(\}\n|,"replayed":false,[^\n]*\n)|[^\n]*\n')

#: The C scanner under `json.loads`, called directly: durun writes one
#: object a line with nothing around it, so `loads`'s Python wrappers
#: (two regex matches for whitespace) are a tenth of a replay's cost.
# (An attribute every JSONDecoder sets, documented in its source only.)
_scan: Callable[[str, int], Tuple[Any, int]] = json.decoder.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _parsed(line: bytes) -> Any:
    """``json.loads(line)``; its errors as it words them."""
    text = line.decode("utf-8")
    try:
        value, end = _scan(text, 0)
    except Exception:
        return json.loads(text)
    if end < len(text) and text[end:] != "\n":
        return json.loads(text)
    return value


class _Waiter:
    """Where one answer goes: a thread that waits for it (on the channel's
    condition, or reading stdin itself), or an asyncio future in its loop."""

    __slots__ = ("future", "loop", "answer", "spin")

    def __init__(self, loop: Optional["asyncio.AbstractEventLoop"] = None, spin: float = 0.0) -> None:
        self.loop = loop
        # How long its reader looks for the answer before it sleeps.
        self.spin = spin
        self.future: Optional["asyncio.Future[Answer]"] = loop.create_future() if loop else None
        self.answer: Optional[Answer] = None

    def deliver(self, answer: Answer) -> None:
        """With the channel's lock held (whose condition wakes threads)."""
        self.answer = answer
        if self.loop is not None and self.future is not None:
            future = self.future

            def resolve() -> None:
                if not future.done():
                    future.set_result(answer)

            self.loop.call_soon_threadsafe(resolve)


def _numbered(request_id: int, body: bytes) -> bytes:
    """A request's line (made by `_line`) with its id first."""
    return b'{"id":%d,%s' % (request_id, body[1:])


class _Landing:
    """A posted request's owner that wants its answer (a step whose `begin`
    was posted): handed it, with the channel's lock held, when it comes."""

    __slots__ = ()

    def _land(self, answer: Answer) -> None:
        raise NotImplementedError


class _Channel:
    """Requests out on the protocol fd, answers in on stdin, matched by id;
    safe to use from many threads and event loops at once.

    A thread that waits for an answer reads stdin itself (one thread at a
    time, handing other threads' answers to them), so a plain loop of
    steps costs no hand-off between threads. Once an event loop waits for
    an answer, a reader thread takes over the reading for good: a future
    has no thread of its own to read with.

    A step's ``commit`` is posted, not awaited: the step's value is
    returned at once and its answer checked when it is read: every
    `_READ_EVERY` posts, or by any request that waits. A failed commit is
    raised by the request that read it, by ``result`` or at exit (``settle``);
    durun makes every commit durable before the intent of any ``mutate``
    step opened after it, so nothing a later side effect relies on can be
    lost."""

    def __init__(self) -> None:
        # Keep the real stdout for the protocol, then point fd 1 (and so
        # print, and subprocesses) at stderr.
        sys.stdout.flush()
        self._out = os.dup(1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        self._fd = os.dup(0)
        self._buffer = bytearray()
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLIN)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        # Signalled when an answer is handed over or the reading is free.
        self._turn = threading.Condition(self._lock)
        # Threads asleep on `_turn`: with none (a plain loop of steps), an
        # answer wakes no one and costs no notify.
        self._sleepers = 0
        self._waiting: Dict[int, _Waiter] = {}
        # Posted requests whose answers have not come yet: what each
        # refusal is about (see `post`).
        self._posted: Dict[int, Any] = {}
        # Posts since a post last read the answers that came (counted
        # without the lock: a count lost to a race only moves a read).
        self._unread_posts = 0
        # The first posted request durun refused: raised from then on.
        self._refused: Optional[Answer] = None
        self._reader: Optional[threading.Thread] = None
        # A waiting thread is reading stdin now.
        self._leading = False
        # Why the reading stopped, once it has: every later request gets it.
        self._gone: Optional[str] = None
        # durun answered `cancelled`: the run is stopping.
        self.stopping = False
        # The highest step number the journal held when the run started
        # (None from a durun that does not say, or a run whose new steps
        # may be answered as replays): once an answer has reached it, a
        # `read` step is new, and its `begin` need not be awaited.
        held = os.environ.get("DURUN_JOURNAL_STEPS", "")
        self._journal_steps: Optional[int] = int(held) if held.isdigit() else None
        # The highest step number in any answer so far.
        self._last_step = 0
        # Per spin cap: the budget a wait spins now, and the waits so far.
        self._spins: Dict[float, List[Any]] = {}
        # Recorded steps durun offered, to replay without asking.
        self._ahead = _Ahead(os.environ.get("DURUN_TASK_ID", ""))

    def send(self, messages: List[Dict[str, Any]], loop: Optional["asyncio.AbstractEventLoop"] = None,
             bodies: Optional[List[bytes]] = None, spin: Optional[float] = None) -> List[_Waiter]:
        """Writes every message, in order, before any answer is awaited:
        the order of the lines is the order of the steps. `bodies`, if
        given, are the messages already made lines (by `_line`)."""
        if bodies is None:
            bodies = [_line(message) for message in messages]
        with self._lock:
            self._raise_refused()
            waiters = []
            out = [self._replayed_line()]
            for message, body in zip(messages, bodies):
                request_id = message["id"] = next(self._ids)
                waiter = _Waiter(loop, _SPIN if spin is None else spin)
                waiters.append(waiter)
                if self._gone is not None:
                    waiter.deliver(self._failure(request_id))
                    continue
                self._waiting[request_id] = waiter
                out.append(_numbered(request_id, body))
            self._write(b"".join(out))
            if loop is not None and not self._leading:
                self._start_reader()
        return waiters

    def post(self, body: bytes, about: Any) -> int:
        """Sends a request whose answer no one waits for (see the class),
        a line made by `_line` or its like; returns its id. ``about`` is the
        step a refusal is about (a number, or a callable that gives it), or
        a `_Landing` handed the answer."""
        posted = self._posted
        self._unread_posts += 1
        if self._unread_posts >= _READ_EVERY or len(posted) >= _MAX_POSTED:
            # The answers that came are read in one chunk, every so many
            # posts rather than at each step's (a look at the pipe and a
            # read a step were a third of a short step's time): a refusal
            # among them is raised by this request, as by one that waits,
            # at most this many posts after it came.
            self._unread_posts = 0
            self._read_ready()
            if len(posted) >= _MAX_POSTED:
                self._await_until(lambda: len(posted) < _MAX_POSTED, _SPIN)
        with self._lock:
            if self._refused is not None:
                raise _error(self._refused)
            request_id = next(self._ids)
            if self._gone is not None:
                if isinstance(about, _Landing):
                    about._land(self._failure(request_id))
                return request_id
            posted[request_id] = about
            line = b'{"id":%d,%s' % (request_id, body[1:])
            if self._ahead.notice_due():
                line = self._replayed_line() + line
            written = os.write(self._out, line)
            if written < len(line):
                self._write(line[written:])
        return request_id

    def _replayed_line(self) -> bytes:
        """With the lock held: the line that tells durun of the steps
        replayed here since the last one (posted: a refusal is raised by a
        later request), or nothing."""
        notice = self._ahead.notice()
        if notice is None or self._gone is not None:
            return b""
        request_id = notice["id"] = next(self._ids)
        # About no step of the agent's: durun's refusal says what it is.
        self._posted[request_id] = None
        return _line(notice)

    def replay_here(self, name: str, args: Any) -> Optional[Tuple[Any]]:
        """The recorded value of the step about to begin (in a 1-tuple),
        answered from the steps durun offered ahead; None: ask durun.
        Only with no request out, so that the step is durun's next."""
        with self._lock:
            if self._waiting or self._posted or self._gone is not None or self._refused is not None:
                return None
            if not self._ahead.left(self._last_step):
                return None
            taken = self._ahead.take(name, args)
            if taken is None:
                return None
            self._last_step = taken[1]
            return (taken[0],)

    def ahead(self) -> Optional[Dict[str, Any]]:
        """An `ahead` request to send with the next `begin`, when the step is
        one the journal held and no step durun offered is left (nor asked
        for already: it counts as asked from here); `request_line` and
        `arequest_line` send it and keep its answer."""
        if self._journal_steps is None or self.past_journal():
            return None
        with self._lock:
            ahead = self._ahead
            if ahead.asked or ahead.off or ahead.empty_at == self._last_step or ahead.left(self._last_step):
                return None
            ahead.asked = True
        return {"op": "ahead"}

    def took_ahead(self, answer: Answer) -> None:
        """Keeps durun's answer to `ahead`."""
        with self._lock:
            self._ahead.offered(answer, self._last_step)

    def _write(self, data: bytes) -> None:
        """With the lock held: whole lines to durun, in order."""
        while data:
            data = data[os.write(self._out, data):]

    def _read_ready(self) -> None:
        """Reads the answers that have come, without waiting for any, when
        no other thread reads."""
        with self._lock:
            if self._leading or self._reader is not None or not self._posted:
                return
            self._leading = True
        try:
            # One look at the pipe: what came is read in one chunk, and
            # the lines it holds are all taken, with no second look.
            if self._poll.poll(0):
                try:
                    chunk = os.read(self._fd, 1 << 16)
                except OSError as exc:
                    self._close(f"the SDK could not read durun's answer: {exc}")
                    return
                if not chunk:
                    self._close("durun closed the protocol")
                    return
                self._buffer += chunk
            self._take_lines()
        finally:
            with self._lock:
                self._leading = False
                self._wake()

    def _take_lines(self) -> bool:
        """Takes every whole line in the buffer: the answers to posted
        requests that durun accepted here, under one hold of the lock, and
        any other line as `_take` does; False once the channel is closed."""
        buffer = self._buffer
        end = buffer.rfind(b"\n")
        if end < 0:
            return True
        data = bytes(buffer[:end + 1])
        del buffer[:end + 1]
        answers = _ANSWERS.finditer(data)
        other = None
        while True:
            with self._lock:
                posted = self._posted
                last = self._last_step
                for found in answers:
                    rest = found[3]
                    about = posted.pop(int(found[1]), self) if rest is not None else self
                    if rest == _COMMITTED and about is not self and about is not None:
                        continue
                    if isinstance(about, _Landing):
                        # A posted `begin` opened its step: the rest of
                        # the answer is read if asked for.
                        step = int(found[2])
                        if step > last:
                            last = step
                        about._land({"id": int(found[1]), "ok": True, "step": step, "_line": found[0]})
                        continue
                    if about is not self:
                        posted[int(found[1])] = about
                    other = found[0]
                    break
                self._last_step = last
                self._wake()
            if other is None:
                return True
            if not self._take(other):
                return False
            other = None

    def past_journal(self) -> bool:
        """Whether the next step is past every step the journal held when
        the run started: new, never a replay or a divergence."""
        return self._journal_steps is not None and self._last_step >= self._journal_steps

    def settle(self) -> None:
        """Waits for the answer of every posted request; raises the first
        refusal."""
        with self._lock:
            told = self._replayed_line()
            if told:
                self._write(told)
        self._await_until(lambda: not self._posted, _SPIN)
        with self._lock:
            self._raise_refused()

    def _start_reader(self) -> None:
        """With the lock held: a thread to read for the futures."""
        if self._reader is None and self._gone is None:
            self._reader = threading.Thread(target=self._read, name="durun-reader", daemon=True)
            self._reader.start()

    def request_line(self, message: Dict[str, Any], body: bytes, spin: Optional[float] = None,
                     ahead: Optional[Dict[str, Any]] = None) -> Answer:
        """A request already made a line (by `_line`), its answer awaited;
        with `ahead` (from `ahead()`) sent after it, and its answer, which
        durun gives at once, awaited and kept too."""
        if ahead is None:
            waiters = self.send([message], bodies=[body], spin=spin)
        else:
            waiters = self.send([message, ahead], bodies=[body, _line(ahead)], spin=spin)
            self._await(waiters[1])
            self.took_ahead(cast(Answer, waiters[1].answer))
        self._await(waiters[0])
        self._raise_refused()
        return cast(Answer, waiters[0].answer)

    async def arequest_line(self, message: Dict[str, Any], body: bytes,
                            ahead: Optional[Dict[str, Any]] = None) -> Answer:
        import asyncio

        if ahead is None:
            waiters = self.send([message], asyncio.get_running_loop(), bodies=[body])
        else:
            # Not awaited: kept when it comes, while the agent goes on.
            waiters = self.send([message, ahead], asyncio.get_running_loop(), bodies=[body, _line(ahead)])
            cast("asyncio.Future[Answer]", waiters[1].future).add_done_callback(
                lambda future: self.took_ahead(future.result()))
        answer = await cast("asyncio.Future[Answer]", waiters[0].future)
        self._raise_refused()
        return answer

    def request(self, message: Dict[str, Any], spin: Optional[float] = None) -> Answer:
        return self.request_all([message], spin)[0]

    def request_all(self, messages: List[Dict[str, Any]], spin: Optional[float] = None) -> List[Answer]:
        waiters = self.send(messages, spin=spin)
        for waiter in waiters:
            self._await(waiter)
        self._raise_refused()
        return [cast(Answer, waiter.answer) for waiter in waiters]

    def _raise_refused(self) -> None:
        """A refusal read while waiting is raised by the request that waited:
        durun's answer to it (most often `cancelled`, the run stopping) is
        a consequence."""
        if self._refused is not None:
            raise _error(self._refused)

    def _await(self, waiter: _Waiter) -> None:
        """Waits for `waiter`'s answer, reading stdin itself when no one
        else does."""
        self._await_until(lambda: waiter.answer is not None, waiter.spin)

    def _await_until(self, done: Callable[[], bool], spin: float) -> None:
        """Waits until `done()`, which answers read make true, reading stdin
        itself when no one else does."""
        while not done():
            with self._lock:
                while not done() and (self._leading or self._reader is not None):
                    self._sleepers += 1
                    self._turn.wait()
                    self._sleepers -= 1
                if done():
                    return
                self._leading = True
            try:
                while not done() and self._read_one(spin):
                    pass
            finally:
                with self._lock:
                    self._leading = False
                    # Futures still waiting need a reader of their own now.
                    if self._waiting and any(other.loop is not None for other in self._waiting.values()):
                        self._start_reader()
                    self._wake()

    async def arequest(self, message: Dict[str, Any]) -> Answer:
        return (await self.arequest_all([message]))[0]

    async def arequest_all(self, messages: List[Dict[str, Any]]) -> List[Answer]:
        import asyncio

        waiters = self.send(messages, asyncio.get_running_loop())
        answers = [await cast("asyncio.Future[Answer]", waiter.future) for waiter in waiters]
        self._raise_refused()
        return answers

    def _failure(self, request_id: int) -> Answer:
        return {"id": request_id, "ok": False, "error": {"code": "cancelled", "message": self._gone}}

    def _spin_for_answer(self, cap: float) -> None:
        """Looks for an answer for up to the current budget of waits with
        this `cap`. The budget adapts to what spinning gains: it halves
        each time the answer did not come within it (a busy machine, where
        the spin only takes a core from durun) down to nothing, and one
        wait in `_PROBE` spins the whole cap to see whether answers come
        quickly again, which restores it."""
        state = self._spins.get(cap)
        if state is None:
            state = self._spins[cap] = [cap, 0]
        budget = state[0]
        state[1] += 1
        if budget < cap and state[1] % _PROBE == 0:
            budget = cap
        if budget <= 0.0:
            return
        poll = self._poll.poll
        clock = time.perf_counter
        deadline = clock() + budget
        while not poll(0):
            if clock() >= deadline:
                state[0] = state[0] / 2 if state[0] > 2e-6 else 0.0
                return
        state[0] = cap

    def _read_one(self, spin: float = _SPIN) -> bool:
        """Reads until a whole line has come and hands over every answer
        read; False once stdin is done (every waiter then gets an error,
        now and later). Right after a request its answer usually comes
        within microseconds: the reader looks for it briefly before it
        sleeps, since a wake-up from sleep costs more than the answer."""
        try:
            while b"\n" not in self._buffer:
                if spin > 0.0:
                    self._spin_for_answer(spin)
                chunk = os.read(self._fd, 1 << 16)
                if not chunk:
                    return self._close("durun closed the protocol")
                self._buffer += chunk
        except Exception as exc:  # a pipe the SDK cannot read: no answer can be trusted
            return self._close(f"the SDK could not read durun's answer: {exc}")
        return self._take_lines()

    def _take(self, line: bytes) -> bool:
        """Hands over one answer that `_take_lines` does not take itself;
        False once it cannot be read (every waiter then gets an error, now
        and later)."""
        try:
            answer: Answer = _parsed(line)
        except Exception as exc:  # a line the SDK cannot read: no answer can be trusted
            return self._close(f"the SDK could not read durun's answer: {exc}")
        if (answer.get("error") or {}).get("code") == "cancelled":
            self.stopping = True
        number = answer.get("step")
        if type(number) is int and number > self._last_step:
            self._last_step = number
        with self._lock:
            request_id = answer.get("id", 0)
            about = self._posted.pop(request_id, self)
            if about is not self:
                # No one waits for it (a pipelined request): checked here.
                if isinstance(about, _Landing):
                    about._land(answer)
                    about = None
                if not answer.get("ok") and self._refused is None:
                    about = about() if callable(about) else about
                    self._refused = {**answer, "step": answer.get("step", about)}
            else:
                waiter = self._waiting.pop(request_id, None)
                if waiter is not None:
                    waiter.deliver(answer)
            self._wake()
        return True

    def _wake(self) -> None:
        """With the lock held: wakes the threads waiting on `_turn`."""
        if self._sleepers:
            self._turn.notify_all()

    def _close(self, why: str) -> bool:
        with self._lock:
            self._gone = why
            waiting = list(self._waiting.items())
            self._waiting.clear()
            posted = list(self._posted.items())
            self._posted.clear()
            for request_id, waiter in waiting:
                waiter.deliver(self._failure(request_id))
            # A posted commit unanswered is not a refusal (the run is
            # ending; the next request says so); a posted `begin`'s step
            # cannot commit.
            for request_id, about in posted:
                if isinstance(about, _Landing):
                    about._land(self._failure(request_id))
            self._turn.notify_all()
        return False

    def _read(self) -> None:
        while self._read_one():
            pass
