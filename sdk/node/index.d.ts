// Types of durun for JavaScript and TypeScript (see index.js).

/** A JSON value, as the journal holds it. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

export interface StepContext {
  /** The step's number in the task. */
  step: number;
  /** The same on every attempt of the step: hand it to the API it calls. */
  idempotencyKey: string;
  attempt: number;
  /** A run died inside the step: it may have taken effect. */
  inDoubt: boolean;
  usage: { input_tokens: number; output_tokens: number } | null;
}

export interface StepOptions {
  /** "read" (safe to repeat, the default) or "mutate" (changes the world). */
  effect?: "read" | "mutate";
  /** More attempts after a failure, each journaled under the same key. */
  retries?: number;
  /** Seconds before the first retry, doubling after each. */
  backoff?: number;
  /** Seconds one attempt may take. */
  timeout?: number;
}

export interface Signal {
  signal: string;
  data: Json;
  /** `user@host` of the sender. */
  by: string;
  /** RFC 3339. */
  at: string;
}

export interface WaitOptions {
  /** Like "48h", or seconds: fail with Timeout once it passed with no signal. */
  timeout?: string | number;
}

export class DurunError extends Error {
  /** The protocol's error code. */
  readonly code: string;
  readonly step?: number;
  readonly output?: Json;
}
export class BadRequest extends DurunError {}
export class UnknownTool extends DurunError {}
export class ToolFailed extends DurunError {}
export class Timeout extends DurunError {}
export class Divergence extends DurunError {}
export class Cancelled extends DurunError {}
export class JournalError extends DurunError {}
export class BudgetExceeded extends DurunError {}
export class NotUnderDurun extends DurunError {}

/** Whether the script runs under durun. */
export function active(): boolean;

/**
 * Runs `fn()` as journaled step `name` unless the journal holds it;
 * resolves with what the journal holds (fn's value, as JSON), as soon as
 * its commit is sent (a refused commit is thrown by the next call).
 */
export function step<T>(name: string, args: Json | object, fn: () => T | Promise<T>, options?: StepOptions): Promise<T>;

/** The step running in this async context. */
export function current(): StepContext | undefined;

/** Records the token usage of the step running here. */
export function usage(inputTokens?: number, outputTokens?: number): void;

/** Runs a tool from durun.toml; without durun, once through `durun call`. */
export function call<T = Json>(tool: string, args?: object): Promise<T>;

/** Runs several tools at once, numbered in list order. */
export function callAll<T = Json>(calls: Array<[string, object]>): Promise<T[]>;

/** Stores the task's final output. */
export function result(value: Json | object): Promise<void>;

/** Waits for `durun signal TASK NAME`. A long wait parks the task (exit 77). */
export function wait(name: string, data?: Json | object, options?: WaitOptions): Promise<Signal>;

/** What `join` answers: the child's id, how it ended, and its output. */
export interface Joined<T = Json> {
  task: string;
  status: "completed" | "failed" | "cancelled";
  output: T | null;
}

/** Starts a child task (`PARENT-sN`, made once) and returns its id. */
export function spawn(name: string, command: string[], args?: Json | object, options?: { queue?: string }): Promise<string>;

/** Waits for child `task` to end. A long wait parks the task (exit 77). */
export function join<T = Json>(task: string, options?: WaitOptions): Promise<Joined<T>>;

/** Joins several children at once, in order. */
export function joinAll<T = Json>(tasks: string[], options?: WaitOptions): Promise<Joined<T>[]>;

/** In a child task: the args its parent spawned it with (null elsewhere). */
export function childArgs<T = Json>(): T | null;

/** In a child task: its parent's id (null elsewhere). */
export function parentTask(): string | null;

/** Waits for `durun approve TASK` (true) or `durun reject TASK` (false). */
export function approval(data?: Json | object, options?: WaitOptions & { name?: string }): Promise<boolean>;

/** Sleeps durably, for seconds or until a Date. A long sleep parks the task. */
export function sleep(until: number | Date): Promise<void>;

/** The time, journaled. */
export function now(): Promise<Date>;
/** A random number in [0, 1), journaled. */
export function random(): Promise<number>;
/** A random UUID, journaled. */
export function uuid(): Promise<string>;
/** True on new paths, false while a task recorded before patch `name` replays. */
export function patched(name: string): Promise<boolean>;

/**
 * Journals every model call of an `openai` or `@anthropic-ai/sdk` client
 * (`chat.completions.create`, `responses.create`, `messages.create`),
 * streams included. The client keeps its type.
 */
export function wrap<C extends object>(client: C, provider?: string): C;

/** The key durun derives for step `step` of task `task` with `args`
 * (sha256 of `TASK:STEP:` and the args' canonical JSON). */
export function idempotencyKey(task: string, step: number, args: Json): string;

/** `args` as Python's `json.dumps(args, sort_keys=True)` prints what durun
 * reads from `JSON.stringify(args)`: the form keys are derived from. */
export function canonicalJson(args: Json): string;
