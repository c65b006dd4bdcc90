// durun for JavaScript and TypeScript: journaled steps that survive a crash.
//
// Run the script with `durun run -- node agent.mjs`. Each step is recorded
// in durun's journal; after a crash `durun resume` answers the steps that
// finished from the journal (no LLM call, no repeated side effect) and runs
// the rest. No runtime dependency; Node 18 or later.
//
// Under durun the SDK owns the process's stdout for the protocol:
// `console.log` and `process.stdout.write` go to stderr. A child process
// started with `stdio: "inherit"` would write into the protocol: give it
// `stdio: ["inherit", process.stderr, "inherit"]`.

import { AsyncLocalStorage } from "node:async_hooks";
import { createRequire } from "node:module";
import { idempotencyKey } from "./keys.js";
import {
  BadRequest,
  BudgetExceeded,
  Cancelled,
  DurunError,
  Divergence,
  ERRORS,
  JournalError,
  NotUnderDurun,
  Timeout,
  ToolFailed,
  UnknownTool,
  checked,
  clock,
  errorOf,
  getChannel,
  isOpen,
  MAX_POSTED,
} from "./channel.js";

// node:child_process and node:crypto are loaded when first used (`durun
// call` outside durun, `durun.uuid`): each costs milliseconds of a start.
const require = createRequire(import.meta.url);

export { BadRequest, BudgetExceeded, Cancelled, DurunError, Divergence, JournalError, NotUnderDurun, Timeout, ToolFailed, UnknownTool };

/** Whether the script runs under durun. */
export function active() {
  // Once the channel is open the environment need not be read each step.
  return isOpen() || process.env.DURUN_PROTOCOL === "1";
}

// ---------------------------------------------------------------------------
// Values: JSON, by rule; anything else refused by name.

/** `value` as JSON holds it: the value itself when it is JSON already (no
 * copy: a step's args and value are most often plain objects, and copying
 * them was a good part of a short step), else a copy with Dates and
 * `toJSON` applied and `undefined` members dropped. `where` says, when
 * called, what holds the value, for the refusal of one JSON cannot hold. */
function encode(value, where) {
  if (value === null || typeof value === "boolean" || typeof value === "string") return value;
  if (value === undefined) return null;
  if (typeof value === "number") {
    if (!Number.isFinite(value)) throw new TypeError(`durun: ${where()} holds ${value}, which JSON cannot hold`);
    return value;
  }
  if (Array.isArray(value)) {
    let out = null;
    for (let i = 0; i < value.length; i++) {
      const item = value[i];
      const encoded = encode(item, where);
      if (out === null && encoded !== item) out = value.slice(0, i);
      if (out !== null) out.push(encoded);
    }
    return out ?? value;
  }
  if (value instanceof Date) return value.toISOString();
  if (typeof value === "object") {
    if (typeof value.toJSON === "function") return encode(value.toJSON(), where);
    const proto = Object.getPrototypeOf(value);
    if (proto === Object.prototype || proto === null) {
      let out = null;
      const keys = Object.keys(value);
      for (let i = 0; i < keys.length; i++) {
        const item = value[keys[i]];
        // An `undefined` member is dropped: a copy, as for any change.
        const encoded = item === undefined ? undefined : encode(item, where);
        if (out === null && (encoded !== item || item === undefined)) out = copied(value, keys, i);
        if (out !== null && encoded !== undefined) out[keys[i]] = encoded;
      }
      return out ?? value;
    }
    throw new TypeError(
      `durun: ${where()} holds a ${value.constructor?.name ?? "object"}, which durun cannot journal: ` +
        "use JSON values (plain objects, arrays, strings, numbers, booleans, null, Dates) or convert it yourself",
    );
  }
  throw new TypeError(`durun: ${where()} holds a ${typeof value}, which durun cannot journal`);
}

/** A new object with the first `count` of `keys` of `value`, all JSON. */
function copied(value, keys, count) {
  const out = {};
  for (let i = 0; i < count; i++) out[keys[i]] = value[keys[i]];
  return out;
}

// ---------------------------------------------------------------------------
// Steps.

const running = new AsyncLocalStorage();

/** The step running here (in this async context), or undefined. */
export function current() {
  return running.getStore();
}

/**
 * A new `read` step whose `begin` was posted. Its number and key are what
 * durun will answer if no one else (a model call through the proxy
 * outside any step, `durun step`) opens a step meanwhile: the key is
 * derived here (SPEC 3.1's formula). A body that used them is checked
 * against durun's answer before the step commits.
 */
class PostedStep {
  constructor(guess) {
    this.guess = guess;
    // The `begin` as written: its args as they were then (they are the
    // agent's own object, which the body may change).
    this.sent = null;
    this.beginId = null;
    // The `begin`'s answer once it came, and who awaits it meanwhile.
    this.answer = null;
    this.awaiting = null;
    this.used = false;
    this.attempt = 1;
    this.inDoubt = false;
    this.usage = null;
  }

  /** The `begin`'s answer (from the channel). */
  land(answer) {
    this.answer = answer;
    if (this.awaiting !== null) for (const resolve of this.awaiting.splice(0)) resolve(answer);
  }

  get step() {
    if (this.answer?.ok) return this.answer.step;
    this.used = true;
    return this.guess;
  }

  get idempotencyKey() {
    if (this.answer?.ok) return this.answer.idempotency_key;
    this.used = true;
    this.key ??= idempotencyKey(process.env.DURUN_TASK_ID ?? "", this.guess, JSON.parse(this.sent).args);
    return this.key;
  }

  /** The step as durun opened it: its `begin`'s refusal is thrown. */
  async answered() {
    const answer = this.answer ?? (await new Promise((resolve) => (this.awaiting ??= []).push(resolve)));
    getChannel().check();
    if (!answer.ok) throw errorOf(answer);
    return {
      step: answer.step,
      idempotencyKey: answer.idempotency_key,
      attempt: answer.attempt ?? 1,
      inDoubt: false,
      usage: this.usage,
    };
  }

  /** Throws if the body used a number or key that durun did not give. */
  async verify() {
    if (!this.used) return;
    const opened = await this.answered();
    if (this.key !== undefined && opened.step === this.guess && opened.idempotencyKey !== this.key) {
      await checked(getChannel().request({ op: "fail", step: opened.step, error: "ran with a key durun did not derive" }));
      throw new DurunError(
        `step ${opened.step} ran with key ${this.key}, and durun derived ${opened.idempotencyKey}: ` +
          "the SDK's canonical JSON differs from durun's for these args (a bug: please report it with them)",
        opened.step,
      );
    }
    if (opened.step !== this.guess) {
      await checked(getChannel().request({ op: "fail", step: opened.step, error: "ran with another step's key" }));
      throw new BadRequest(
        `step ${opened.step} ran with the key of step ${this.guess}: another client opened a step while its ` +
          "`begin` was on the way (a model call through the proxy outside any step, `durun step`); " +
          "a resume runs it again with its own key",
        opened.step,
      );
    }
  }
}

/** A step whose body ran this long (or that reported usage) waits for its
 * commit to be durable; shorter ones are posted. */
const DURABLE_AFTER_MS = 5;

/** Records the token usage of the step running here. */
export function usage(inputTokens = 0, outputTokens = 0) {
  const context = current();
  if (context) context.usage = { input_tokens: Number(inputTokens), output_tokens: Number(outputTokens) };
}

function usageOf(value) {
  const found = value && typeof value === "object" ? value.usage : undefined;
  if (found && typeof found === "object" &&
      ["input_tokens", "output_tokens", "prompt_tokens", "completion_tokens"].some((key) => key in found)) {
    return found;
  }
  return null;
}

const sleepFor = (seconds) => new Promise((resolve) => setTimeout(resolve, seconds * 1000));

async function attempt(fn, timeout, name) {
  if (timeout === undefined) return await fn();
  let timer;
  const limit = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Timeout(`step ${JSON.stringify(name)} ran past its timeout of ${timeout}s`)), timeout * 1000);
  });
  try {
    return await Promise.race([fn(), limit]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Runs `fn()` as journaled step `name` unless the journal holds it, and
 * resolves with what the journal holds (the value fn returned, as JSON).
 * Options: `effect` ("read" or "mutate"), `retries`, `backoff` (seconds,
 * doubling) and `timeout` (seconds per attempt): every attempt is
 * journaled under the same idempotency key.
 */
export async function step(name, args, fn, options = {}) {
  const { effect = "read", retries = 0, backoff = 1, timeout } = options;
  if (effect !== "read" && effect !== "mutate") throw new TypeError('effect must be "read" or "mutate"');
  if (!active()) {
    for (let tries = 1; ; tries++) {
      try {
        return await attempt(fn, timeout, name);
      } catch (err) {
        if (tries > retries) throw err;
        await sleepFor(backoff * 2 ** (tries - 1));
      }
    }
  }
  const chan = getChannel();
  const encoded = encode(args ?? {}, () => `the args of step ${JSON.stringify(name)}`);
  const begin = { op: "begin", name, args: encoded, effect };
  let context;
  if (effect === "read" && chan.pastJournal()) {
    // New: it cannot be a replay or diverge, so it runs at once; its
    // `begin` is answered meanwhile, checked as posted commits are.
    if (chan.posted.size >= MAX_POSTED) {
      // The args as they are now: the agent may change them meanwhile.
      begin.args = JSON.parse(JSON.stringify(encoded));
      await chan.room();
    }
    const posted = new PostedStep(chan.nextStep++);
    posted.sent = chan.post(begin, (answer) => posted.land(answer));
    // durun closed the protocol: the step cannot be journaled, so its
    // body does not run (a model call would be paid for and lost), as
    // with a `begin` awaited.
    if (posted.answer !== null && !posted.answer.ok) throw errorOf(posted.answer);
    posted.beginId = begin.id;
    context = posted;
  } else {
    // Answered here, or sent before the first await: steps are numbered
    // in the order they are called.
    const here = chan.replayHere(name, encoded);
    if (here !== null) return here.output;
    // A `read` step's answer, or a replay's, comes from durun's memory.
    const opened = await checked(chan.begin(begin, effect === "read" || !chan.pastJournal()));
    if (opened.replayed) return opened.output;
    context = {
      step: opened.step,
      idempotencyKey: opened.idempotency_key,
      attempt: opened.attempt ?? 1,
      inDoubt: opened.in_doubt ?? false,
      usage: null,
    };
  }
  for (let tries = 1; ; tries++) {
    let value;
    const began = clock();
    try {
      value = running.run(context, timeout === undefined ? fn : () => attempt(fn, timeout, name));
      // A body that returned a value, not a promise, costs no turn of the
      // microtask queue.
      if (typeof value?.then === "function") value = await value;
    } catch (err) {
      if (context instanceof PostedStep) context = await context.answered();
      await checked(chan.request({ op: "fail", step: context.step, error: `${err?.name ?? "Error"}: ${err?.message ?? err}` }));
      if (tries > retries || (err instanceof DurunError && !(err instanceof Timeout))) throw err;
      await sleepFor(backoff * 2 ** (tries - 1));
      const reopened = await checked(chan.request({ op: "retry", step: context.step }));
      context = { ...context, attempt: reopened.attempt ?? context.attempt + 1, inDoubt: false, usage: null };
      continue;
    }
    if (context instanceof PostedStep && context.used) await context.verify();
    let stored;
    try {
      stored = encode(value, () => `the value step ${JSON.stringify(name)} returned`);
    } catch (err) {
      if (context instanceof PostedStep) context = await context.answered();
      await chan.request({ op: "fail", step: context.step, error: err.message });
      throw err;
    }
    // A step whose `begin` was posted is named by it: its number may not
    // be known yet.
    const closes = context instanceof PostedStep ? { begin: context.beginId } : { step: context.step };
    const commit = { op: "commit", ...closes, output: stored, usage: context.usage ?? usageOf(stored) };
    if (commit.usage || clock() - began >= DURABLE_AFTER_MS) {
      // A model call, or a step that took a while: it returns once its
      // commit is durable, so a SIGKILL of durun cannot lose it and its
      // call is never paid for twice.
      await checked(chan.request(commit));
    } else {
      // Posted: the agent goes on while durun writes it (see Channel).
      chan.post(commit, () => context.answer?.step ?? context.step);
    }
    return stored;
  }
}

// ---------------------------------------------------------------------------
// Tools.

function standalone(tool, args) {
  let out;
  try {
    out = require("node:child_process").execFileSync("durun", ["call", tool, "--json", "--args", JSON.stringify(args)], {
      encoding: "utf8",
      stdio: ["ignore", "pipe", "pipe"],
    });
  } catch (err) {
    if (err.code === "ENOENT") {
      throw new NotUnderDurun(`durun.call(${JSON.stringify(tool)}) runs the tool through \`durun call\`, and durun is not on PATH`);
    }
    out = String(err.stdout ?? "");
    if (!out.trim()) {
      const lines = String(err.stderr ?? "").trim().split("\n");
      throw new ToolFailed(`\`durun call ${tool} --json\` gave no answer (${lines[lines.length - 1] || err.message}); is the durun on PATH older than this SDK?`);
    }
  }
  // `--json` answers on stdout whatever happened: the error's code, not
  // the wording of a line on stderr, says what kind it is.
  let answer;
  try {
    answer = JSON.parse(out);
  } catch {
    throw new ToolFailed(`\`durun call ${tool} --json\` answered no JSON: ${out.slice(0, 200)}`);
  }
  if (answer.ok) return answer.output;
  const error = answer.error || {};
  const Cls = error.code === NotUnderDurun.code ? NotUnderDurun : ERRORS[error.code] || DurunError;
  throw new Cls(error.message || "durun call failed");
}

/** Runs `tool` from durun.toml with `args`; without durun, once through `durun call`. */
export async function call(tool, args = {}) {
  const encoded = encode(args, () => `the args of tool ${JSON.stringify(tool)}`);
  if (!active()) return standalone(tool, encoded);
  return (await checked(getChannel().request({ op: "call", tool, args: encoded }))).output;
}

/** Runs several tools at once; numbered in list order. */
export async function callAll(calls) {
  const requests = calls.map(([tool, args]) => ({
    op: "call",
    tool,
    args: encode(args ?? {}, () => `the args of tool ${JSON.stringify(tool)}`),
  }));
  if (!active()) return requests.map((request) => standalone(request.tool, request.args));
  const answers = await Promise.all(getChannel().send(requests));
  getChannel().check();
  for (const answer of answers) if (!answer.ok) throw errorOf(answer);
  return answers.map((answer) => answer.output);
}

/** Stores the task's final output (shown by `durun inspect`). */
export async function result(value) {
  if (!active()) return;
  const chan = getChannel();
  await chan.settle();
  await checked(chan.request({ op: "result", output: encode(value, () => "the task's result") }));
}

// ---------------------------------------------------------------------------
// Waiting for people and time.

/**
 * Waits for the signal `name` (`durun signal TASK NAME --data JSON`) and
 * resolves with `{signal, data, by, at}`. A long wait parks the task.
 */
export async function wait(name, data = null, options = {}) {
  if (!active()) throw new NotUnderDurun(`durun.wait(${JSON.stringify(name)}) needs durun`);
  const request = { op: "wait", name, data: encode(data, () => `the data of wait ${JSON.stringify(name)}`) };
  if (options.timeout !== undefined) request.timeout = options.timeout;
  return (await checked(getChannel().request(request))).output;
}

/**
 * Starts a child task and returns its id (`PARENT-sN`: a replay or a retry
 * never makes a second child). On `options.queue` a worker runs it, without
 * one durun runs it beside this agent; it reads `args` with `childArgs()`.
 */
export async function spawn(name, command, args = null, options = {}) {
  if (!active()) throw new NotUnderDurun(`durun.spawn(${JSON.stringify(name)}) needs durun`);
  if (!Array.isArray(command) || command.length === 0 || !command.every((word) => typeof word === "string")) {
    throw new TypeError("durun.spawn() takes the child's argv as an array of strings, e.g. ['node', 'research.mjs']");
  }
  const request = { op: "spawn", name, command, args: encode(args, () => `the args of spawn ${JSON.stringify(name)}`) };
  if (options.queue !== undefined) request.queue = options.queue;
  return (await checked(getChannel().request(request))).output.task;
}

/** Waits for child `task` to end: `{task, status, output}` (a failure is data). */
export async function join(task, options = {}) {
  if (!active()) throw new NotUnderDurun(`durun.join(${JSON.stringify(task)}) needs durun`);
  const request = { op: "join", task };
  if (options.timeout !== undefined) request.timeout = options.timeout;
  return (await checked(getChannel().request(request))).output;
}

/** Joins several children at once; the results in the same order. */
export async function joinAll(tasks, options = {}) {
  return await Promise.all(tasks.map((task) => join(task, options)));
}

/** In a child task: the args its parent spawned it with (null elsewhere). */
export function childArgs() {
  const text = process.env.DURUN_ARGS;
  return text === undefined ? null : JSON.parse(text);
}

/** In a child task: its parent's id (null elsewhere). */
export function parentTask() {
  return process.env.DURUN_PARENT_TASK ?? null;
}

/** Waits for `durun approve TASK` (true) or `durun reject TASK` (false). */
export async function approval(data = null, options = {}) {
  const signal = await wait(options.name ?? "approval", data, options);
  return signal?.data?.approved === true;
}

/** Sleeps durably: seconds, or until a Date. */
export async function sleep(until) {
  const request = until instanceof Date
    ? { op: "sleep", until: until.toISOString() }
    : { op: "sleep", seconds: Number(until) };
  if (!active()) {
    const seconds = until instanceof Date ? (until.getTime() - Date.now()) / 1000 : Number(until);
    return sleepFor(Math.max(0, seconds));
  }
  await checked(getChannel().request(request));
}

// ---------------------------------------------------------------------------
// Values that must not change between runs, and code that does.

/** The time, journaled: the first run's on every replay. */
export async function now() {
  return new Date(await step("durun.now", {}, () => new Date().toISOString()));
}

/** A random number in [0, 1), journaled. */
export function random() {
  return step("durun.random", {}, () => Math.random());
}

/** A random UUID, journaled. */
export function uuid() {
  return step("durun.uuid", {}, () => require("node:crypto").randomUUID());
}

/** True on new paths, false while a task recorded before patch `name` replays. */
export async function patched(name) {
  if (!active()) return true;
  return (await checked(getChannel().request({ op: "patched", name }))).patched === true;
}

// ---------------------------------------------------------------------------
// LLM clients: wrap.js.

export { wrap } from "./wrap.js";
export { canonicalJson, idempotencyKey } from "./keys.js";

// Under durun, take stdout for the protocol at once, before the program
// prints anything that could share a line with a request.
if (active()) getChannel();
