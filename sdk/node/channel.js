// The channel: durun's protocol on the process's stdout and stdin, and the
// errors its answers carry.

import { writeSync } from "node:fs";
import { createInterface } from "node:readline";

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
// is thrown by the next request, by `result`, or reported at exit; durun
// makes every commit durable before the intent of any `mutate` step opened
// after it. The process stays alive until every posted answer has come.

/** Posted requests left unanswered before a step waits for answers. */
const MAX_POSTED = 1024;

class Channel {
  constructor() {
    this.nextId = 1;
    this.waiting = new Map();
    // Posted requests whose answers have not come, and who waits for them all.
    this.posted = new Set();
    this.settled = [];
    // The first posted request durun refused, and whether anyone was told.
    this.refused = null;
    this.told = false;
    this.gone = null;
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
    process.on("exit", () => {
      if (this.refused && !this.told) {
        const why = this.refused.error?.message ?? "durun refused it";
        const which = this.refused.step == null ? "a step" : `the commit of step ${this.refused.step}`;
        writeSync(2, `durun: ${which} was refused: ${why}\n`);
        if (!process.exitCode) process.exitCode = 1;
      }
    });
    // The real stdout is the protocol's; everything else printed goes to stderr.
    process.stdout.write = process.stderr.write.bind(process.stderr);
    this.input = createInterface({ input: process.stdin, crlfDelay: Infinity });
    this.input.on("line", (line) => this.answer(line));
    this.input.on("close", () => this.close("durun closed the protocol"));
    this.idle();
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
    const waiter = this.waiting.get(answer.id);
    if (waiter) {
      this.waiting.delete(answer.id);
      waiter(answer);
    }
    this.idle();
  }

  close(why) {
    this.gone = why;
    // A posted commit unanswered when durun closed the protocol is not a
    // refusal: the run is ending, and its next request says so.
    for (const [id, waiter] of this.waiting) if (!this.posted.has(id)) waiter(this.failure(id));
    this.waiting.clear();
    this.posted.clear();
    for (const done of this.settled.splice(0)) done();
  }

  /** Throws the refusal of a posted request, once one came. */
  check() {
    if (this.refused) {
      this.told = true;
      throw errorOf(this.refused);
    }
  }

  /** Sends a request whose answer no one need await (see above); the
   * promise resolves with it, for whoever wants it after all. */
  post(message, about = () => message.step) {
    this.check();
    message.id = this.nextId++;
    if (this.gone !== null) return Promise.resolve(this.failure(message.id));
    this.posted.add(message.id);
    const answered = new Promise((resolve) => {
      this.waiting.set(message.id, (answer) => {
        this.posted.delete(message.id);
        if (!answer.ok && !this.refused) this.refused = { ...answer, step: answer.step ?? about() };
        if (this.posted.size === 0) for (const done of this.settled.splice(0)) done();
        resolve(answer);
      });
    });
    writeAll(Buffer.from(JSON.stringify(message) + "\n"));
    this.idle();
    return answered;
  }

  /** Resolves once few enough posted requests are unanswered: their
   * answers are read only when the event loop runs, and a loop of posted
   * steps that never waits for I/O must not leave them to pile up. */
  async room() {
    if (this.posted.size < MAX_POSTED) return;
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
    if (this.posted.size > 0) await new Promise((resolve) => this.settled.push(resolve));
    this.check();
  }

  failure(id) {
    return { id, ok: false, error: { code: "cancelled", message: this.gone } };
  }

  // Only a request waiting for its answer keeps the process alive.
  idle() {
    if (this.waiting.size === 0) process.stdin.unref?.();
    else process.stdin.ref?.();
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
      writeAll(Buffer.from(messages.map((message) => JSON.stringify(message) + "\n").join("")));
    }
    this.idle();
    return promises;
  }

  request(message) {
    return this.send([message])[0];
  }
}

// Whole lines, in order, even on a non-blocking pipe that is full for a
// moment (durun reads it as fast as it can).
function writeAll(bytes) {
  let offset = 0;
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

