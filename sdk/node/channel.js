// The channel: durun's protocol on the process's stdout and stdin, and the
// errors its answers carry.

import { readSync, writeSync } from "node:fs";
import { Socket } from "node:net";
import { StringDecoder } from "node:string_decoder";
import { Ahead } from "./ahead.js";

export class DurunError extends Error {
  constructor(message, step, output) {
    super(message);
    this.name = new.target.name;
    this.code = new.target.code;
    this.step = step;
    this.output = output;
  }
}
DurunError.code = "error";
export class BadRequest extends DurunError {}
BadRequest.code = "bad_request";
export class UnknownTool extends DurunError {}
UnknownTool.code = "unknown_tool";
export class ToolFailed extends DurunError {}
ToolFailed.code = "tool_failed";
export class Timeout extends DurunError {}
Timeout.code = "timeout";
export class Divergence extends DurunError {}
Divergence.code = "divergence";
export class Cancelled extends DurunError {}
Cancelled.code = "cancelled";
export class JournalError extends DurunError {}
JournalError.code = "journal";
export class BudgetExceeded extends DurunError {}
BudgetExceeded.code = "budget_exceeded";
export class NotUnderDurun extends DurunError {}
NotUnderDurun.code = "not_under_durun";

export const ERRORS = Object.fromEntries(
  [BadRequest, UnknownTool, ToolFailed, Timeout, Divergence, Cancelled, JournalError, BudgetExceeded].map(
    (cls) => [cls.code, cls],
  ),
);

export function errorOf(answer) {
  const error = answer.error || {};
  const Cls = ERRORS[error.code] || DurunError;
  return new Cls(error.message || "durun answered an error", answer.step, answer.output);
}

// ---------------------------------------------------------------------------
// The channel: requests out on fd 1, answers in on stdin, matched by id.
//
// A step's `commit` is posted, not awaited: the step resolves at once and
// the answer is checked when it comes. A refused commit (a journal failure)
// is thrown by a later request (within READ_EVERY / 2 short steps), by
// `result`, or reported at exit; durun makes every commit durable before
// the intent of any `mutate` step opened after it. The process stays alive
// until every posted answer has come.

/** Posted requests left unanswered before a step waits for answers. */
export const MAX_POSTED = 1024;

/** Posted requests between two reads, here, of the answers that came
 * meanwhile: a loop of steps whose bodies return at once never lets the
 * event loop read them, and a refusal among them would go unheard until
 * MAX_POSTED. */
const READ_EVERY = 128;

/** How long a request whose answer durun gives from memory looks for it
 * before the event loop waits (ms), and one wait in how many tries that
 * whole budget whatever it has shrunk to. */
const SPIN_MS = 0.1;
const PROBE = 16;

class Channel {
  constructor() {
    this.nextId = 1;
    this.waiting = new Map();
    // Posted requests whose answers have not come: what each answer is
    // handed to (it gives the step a refusal is about); who waits for
    // them all.
    this.posted = new Map();
    this.settled = [];
    // The first posted request durun refused, and whether anyone was told.
    this.refused = null;
    this.told = false;
    this.gone = null;
    // Whether stdin keeps the process alive now.
    this.held = null;
    // stdin as the event loop reads it (a pipe, non-blocking) can also be
    // read here, at once: see spinFor.
    this.syncReads = process.stdin instanceof Socket && !process.stdin.isTTY;
    this.chunk = Buffer.alloc(1 << 16);
    // The spin's budget (ms): halved each time the answer did not come
    // within it (a busy machine), restored when it did.
    this.spin = SPIN_MS;
    this.spins = 0;
    // Posted requests since answers were last read here.
    this.unreadPosts = 0;
    // The highest step number the journal held when the run started (null
    // from a durun that does not say, or a run whose new steps may be
    // answered as replays): once an answer has reached it, a `read` step
    // is new, and its `begin` need not be awaited.
    const held = process.env.DURUN_JOURNAL_STEPS ?? "";
    this.journalSteps = /^[0-9]+$/.test(held) ? Number(held) : null;
    // The highest step number in any answer, and the number the next
    // step takes if no one else opens steps meanwhile.
    this.lastStep = 0;
    this.nextStep = 1;
    // Recorded steps durun offered, to replay without asking.
    this.offered = new Ahead(process.env.DURUN_TASK_ID ?? "");
    process.on("exit", () => {
      this.flush();
      if (this.refused && !this.told) {
        const why = this.refused.error?.message ?? "durun refused it";
        const which = this.refused.step == null ? "a request" : `the commit of step ${this.refused.step}`;
        writeSync(2, `durun: ${which} was refused: ${why}\n`);
        if (!process.exitCode) process.exitCode = 1;
      }
    });
    // The real stdout is the protocol's; everything else printed goes to stderr.
    process.stdout.write = process.stderr.write.bind(process.stderr);
    // Answers are split into lines here: readline costs more per line than
    // the answer itself.
    this.unread = "";
    this.decoder = new StringDecoder("utf8");
    process.stdin.on("data", (chunk) => this.read(this.decoder.write(chunk)));
    process.stdin.on("end", () => this.close("durun closed the protocol"));
    process.stdin.on("error", (err) => this.close(`the SDK could not read durun's answers: ${err.message}`));
    this.idle();
  }

  read(chunk) {
    const text = this.unread + chunk;
    let start = 0;
    for (let end = text.indexOf("\n"); end >= 0; end = text.indexOf("\n", start)) {
      const line = text.slice(start, end);
      start = end + 1;
      if (this.gone === null) this.answer(line);
    }
    this.unread = text.slice(start);
    this.idle();
  }

  /** Reads what durun has written, without waiting; false if nothing was
   * there (or the protocol ended). */
  readNow() {
    this.unreadPosts = 0;
    // Bytes the stream read but has not handed over yet come first.
    if (process.stdin.readableLength > 0) return false;
    let count;
    try {
      count = readSync(0, this.chunk, 0, this.chunk.length, null);
    } catch (err) {
      if (err.code !== "EAGAIN" && err.code !== "EWOULDBLOCK") this.syncReads = false;
      return false;
    }
    if (count === 0) {
      this.close("durun closed the protocol");
      return false;
    }
    this.read(this.decoder.write(this.chunk.subarray(0, count)));
    return true;
  }

  /** Looks for the answer to request `id` for a moment before the event
   * loop waits for it: an answer from durun's memory (a replayed step)
   * comes within a round trip, before the event loop would wake up. The
   * budget adapts as in the Python SDK: it halves when the answer did not
   * come within it, down to nothing, and one wait in PROBE tries the whole
   * of it again. */
  spinFor(id) {
    if (!this.syncReads) return;
    this.spins += 1;
    const budget = this.spin < SPIN_MS && this.spins % PROBE === 0 ? SPIN_MS : this.spin;
    if (budget <= 0) return;
    const deadline = clock() + budget;
    const came = quietly(() => {
      while (this.waiting.has(id) && this.gone === null) {
        if (!this.readNow() && clock() >= deadline) return false;
      }
      return true;
    });
    this.spin = came ? SPIN_MS : this.spin > 0.002 ? this.spin / 2 : 0;
  }

  answer(line) {
    let answer;
    try {
      answer = JSON.parse(line);
    } catch (err) {
      return this.close(`the SDK could not read durun's answer: ${err.message}`);
    }
    if (Number.isInteger(answer.step) && answer.step > this.lastStep) {
      this.lastStep = answer.step;
      this.nextStep = Math.max(this.nextStep, answer.step + 1);
    }
    const landed = this.posted.get(answer.id);
    if (landed !== undefined) {
      this.posted.delete(answer.id);
      const about = landed(answer);
      if (!answer.ok && !this.refused) this.refused = { ...answer, step: answer.step ?? about };
      if (this.posted.size === 0) for (const done of this.settled.splice(0)) done();
      return;
    }
    const waiter = this.waiting.get(answer.id);
    if (waiter) {
      this.waiting.delete(answer.id);
      waiter(answer);
    }
  }

  close(why) {
    if (this.gone !== null) return;
    this.gone = why;
    // A posted commit unanswered when durun closed the protocol is not a
    // refusal: the run is ending, and its next request says so. A posted
    // `begin` gets the failure: its step cannot commit.
    for (const [id, landed] of this.posted) landed(this.failure(id));
    for (const [id, waiter] of this.waiting) waiter(this.failure(id));
    this.waiting.clear();
    this.posted.clear();
    for (const done of this.settled.splice(0)) done();
    this.idle();
  }

  /** Throws the refusal of a posted request, once one came. */
  check() {
    if (this.refused) {
      this.told = true;
      throw errorOf(this.refused);
    }
  }

  /** Sends a request whose answer no one awaits (see above): `landed` is
   * given the answer when it comes and returns the step a refusal is
   * about. Written at once, never held: a commit must be in the pipe
   * before anything the agent does next, above all a model call through
   * the proxy, which durun would otherwise count into the step still open
   * (and a resume would pay for again). Returns the line written (without
   * its newline), or null when durun closed the protocol. */
  post(message, landed) {
    if (++this.unreadPosts >= READ_EVERY && this.syncReads) quietly(() => this.readNow());
    this.check();
    message.id = this.nextId++;
    if (this.gone !== null) {
      landed(this.failure(message.id));
      return null;
    }
    this.posted.set(message.id, landed);
    const line = JSON.stringify(message);
    this.write(line + "\n");
    this.idle();
    return line;
  }

  /** Writes `text` after the line that tells durun of the steps replayed
   * here since the last one. */
  write(text) {
    writeAll(this.replayedLine() + text);
  }

  /** Writes the line that tells of steps replayed here, if one is due. */
  flush() {
    if (this.offered.unsaid !== null) {
      this.write("");
      // The line that tells of replayed steps is a posted request now.
      this.idle();
    }
  }

  /** The `replayed` line due, posted (a refusal is thrown by a later
   * request), or "". */
  replayedLine() {
    const notice = this.offered.notice();
    if (notice === null || this.gone !== null) return "";
    notice.id = this.nextId++;
    // About no step of the agent's: durun's refusal says what it is.
    this.posted.set(notice.id, () => null);
    return JSON.stringify(notice) + "\n";
  }

  /** The recorded value of the step about to begin, as `{ output }`,
   * answered from the steps durun offered ahead; null: ask durun. Only
   * with no request out, so that the step is durun's next. */
  replayHere(name, args) {
    if (this.waiting.size > 0 || this.posted.size > 0 || this.gone !== null || this.refused) return null;
    if (!this.offered.left(this.lastStep)) return null;
    const recorded = this.offered.take(name, args);
    if (recorded === null) return null;
    this.lastStep = recorded.step;
    this.nextStep = Math.max(this.nextStep, recorded.step + 1);
    return recorded;
  }

  /** Sends a `begin` (`request`'s `spin`), and with it an `ahead` when the
   * step is one the journal held and no step durun offered is left (nor
   * asked for already); that answer is kept when it comes. */
  begin(message, spin) {
    const offered = this.offered;
    const ahead =
      this.journalSteps !== null &&
      !this.pastJournal() &&
      !offered.asked &&
      !offered.off &&
      offered.emptyAt !== this.lastStep &&
      !offered.left(this.lastStep);
    if (!ahead) return this.request(message, spin);
    const asked = { op: "ahead" };
    const [answer, steps] = this.send([message, asked]);
    offered.asked = true;
    steps.then((found) => offered.offered(found, this.lastStep));
    if (spin) {
      this.spinFor(message.id);
      // Its answer comes right after the step's, for the next step.
      this.spinFor(asked.id);
    }
    return answer;
  }

  /** Resolves once few enough posted requests are unanswered: their
   * answers are read only when the event loop runs, and a loop of posted
   * steps that never waits for I/O must not leave them to pile up. */
  async room() {
    this.flush();
    while (this.posted.size >= MAX_POSTED / 2 && this.gone === null) {
      await new Promise((resolve) => setImmediate(resolve));
    }
  }

  /** Whether the next step is past every step the journal held when the
   * run started: new, never a replay or a divergence. */
  pastJournal() {
    return this.journalSteps !== null && this.lastStep >= this.journalSteps;
  }

  /** Resolves once every posted request is answered; rejects with a refusal. */
  async settle() {
    this.flush();
    if (this.posted.size > 0) await new Promise((resolve) => this.settled.push(resolve));
    this.check();
  }

  failure(id) {
    return { id, ok: false, error: { code: "cancelled", message: this.gone } };
  }

  // Only a request whose answer has not come keeps the process alive.
  idle() {
    const hold = this.waiting.size > 0 || this.posted.size > 0;
    if (hold === this.held) return;
    this.held = hold;
    if (hold) process.stdin.ref?.();
    else process.stdin.unref?.();
  }

  /** Sends every message now, in order; resolves with their answers. */
  send(messages) {
    this.check();
    const promises = messages.map((message) => {
      message.id = this.nextId++;
      return new Promise((resolve) => {
        if (this.gone !== null) return resolve(this.failure(message.id));
        this.waiting.set(message.id, resolve);
      });
    });
    if (this.gone === null) {
      this.write(messages.map((message) => JSON.stringify(message) + "\n").join(""));
    }
    this.idle();
    return promises;
  }

  /** `spin`: the answer is expected at once (see spinFor). */
  request(message, spin = false) {
    const answer = this.send([message])[0];
    if (spin) this.spinFor(message.id);
    return answer;
  }
}

/** Milliseconds on a monotonic clock. Not `performance.now()`: Node loads
 * perf_hooks at its first use, 2 ms of a short run's first step. */
export function clock() {
  return Number(process.hrtime.bigint()) / 1e6;
}

// Runs `read`, which looks at the pipe without waiting: an empty pipe is
// an EAGAIN error to Node, and without its stack trace it costs half as
// much.
function quietly(read) {
  const limit = Error.stackTraceLimit;
  Error.stackTraceLimit = 0;
  try {
    return read();
  } finally {
    Error.stackTraceLimit = limit;
  }
}

// Whole lines, in order, even on a non-blocking pipe that is full for a
// moment (durun reads it as fast as it can).
function writeAll(text) {
  // Most often the pipe takes it all at once: written as a string, with
  // no buffer made for it (a few per cent of a short step on Node 24).
  let written = 0;
  try {
    written = writeSync(1, text);
  } catch (err) {
    if (err.code !== "EAGAIN") throw err;
  }
  if (written === Buffer.byteLength(text)) return;
  const bytes = Buffer.from(text);
  let offset = written;
  while (offset < bytes.length) {
    try {
      offset += writeSync(1, bytes, offset, bytes.length - offset);
    } catch (err) {
      if (err.code !== "EAGAIN") throw err;
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 1);
    }
  }
}

let channel = null;
/** Whether the channel is open (the script runs under durun). */
export function isOpen() {
  return channel !== null;
}

export function getChannel() {
  if (channel === null) channel = new Channel();
  return channel;
}

export async function checked(promise) {
  const answer = await promise;
  // A refused commit read meanwhile comes first: this answer (most often
  // `cancelled`, the run stopping) follows from it.
  channel?.check();
  if (!answer.ok) throw errorOf(answer);
  return answer;
}

