// The JavaScript SDK against the real durun: numbering, values, retries,
// divergence, waiting, patches, replayed values, stdout, and wrapped
// clients.
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { spawn, spawnSync } from "node:child_process";

import { durun, durunBin, inspect, repo, sandbox, sdk } from "./helpers.js";

/** Writes `body` as an agent module that imports the SDK as `durun`. */
function agent(box, body, name = "agent.mjs") {
  return box.write(name, `import * as durun from ${JSON.stringify(sdk)};\n${body}\n`);
}

test("concurrent steps and calls are numbered in the order they are called", () => {
  const box = sandbox();
  box.write("durun.toml", '[tools.echo]\neffect = "read"\ncommand = ["echo", "{text}"]\n');
  const path = agent(box, `
const slow = (n) => durun.step("double", { n }, async () => {
  await new Promise((resolve) => setTimeout(resolve, 30 * (3 - n)));
  return n * 2;
});
const doubled = await Promise.all([slow(1), slow(2), slow(3)]);
const echoed = await durun.callAll([["echo", { text: "a" }], ["echo", { text: "b" }]]);
console.log("a print goes to stderr");
await durun.result({ doubled, echoed });
`);
  const run = durun(box, ["run", "--task", "t", "--", "node", path]);
  assert.equal(run.code, 0, run.stderr);
  assert.equal(run.stdout, "", "nothing but the protocol on the agent's stdout");
  assert.match(run.stderr, /a print goes to stderr/);
  const task = inspect(box, "t");
  assert.deepEqual(task.task.output, { doubled: [2, 4, 6], echoed: ["a\n", "b\n"] });
  assert.deepEqual(task.steps.map((step) => step.args), [{ n: 1 }, { n: 2 }, { n: 3 }, { text: "a" }, { text: "b" }]);
  const again = durun(box, ["resume", "t", "--from-step", "6"]);
  assert.equal(again.code, 0, again.stderr);
  assert.deepEqual(inspect(box, "t").task.runs[1].replayed_steps, 5);
});

test("values JSON cannot hold are refused by name, before the work", () => {
  const box = sandbox();
  const path = agent(box, `
let ran = false;
try {
  await durun.step("bad", { client: new Map() }, () => { ran = true; });
} catch (err) {
  console.error("refused:", err.message, "ran:", ran);
}
const when = await durun.step("when", {}, () => new Date(Date.UTC(2026, 11, 1, 9)));
await durun.result({ when });
`);
  const run = durun(box, ["run", "--task", "t", "--", "node", path]);
  assert.equal(run.code, 0, run.stderr);
  assert.match(run.stderr, /refused: durun: the args of step "bad" holds a Map.* ran: false/);
  assert.equal(inspect(box, "t").task.output.when, "2026-12-01T09:00:00.000Z");
});

test("a step's value is its JSON, as a replay gives it; a posted step's key is its args' as sent", () => {
  const box = sandbox();
  // The SDK sends the agent's own objects when they are JSON already, and
  // copies them only when they are not: the body changing its args after
  // the begin went must change neither the args journaled nor the key.
  const path = agent(box, `
const args = { n: 1 };
const value = await durun.step("value", args, () => {
  args.n = 2;
  return { dropped: undefined, kept: [1, { at: new Date(Date.UTC(2026, 0, 1)) }], list: [undefined] };
});
const key = await durun.step("key", args, () => {
  args.n = 3;
  return durun.current().idempotencyKey;
});
await durun.result({ value, dropped: "dropped" in value, key });
`);
  const run = durun(box, ["run", "--task", "t", "--", "node", path]);
  assert.equal(run.code, 0, run.stderr);
  const task = inspect(box, "t");
  assert.deepEqual(task.task.output.value, { kept: [1, { at: "2026-01-01T00:00:00.000Z" }], list: [null] });
  assert.equal(task.task.output.dropped, false, "the value a first run returns has no undefined member");
  assert.deepEqual(task.steps.map((step) => step.args), [{ n: 1 }, { n: 2 }]);
  assert.equal(task.task.output.key, task.steps[1].idempotency_key);
});

test("importing the SDK loads no module a first run does not use", () => {
  // node:child_process and node:crypto cost milliseconds of a start each.
  const box = sandbox();
  const path = box.write("lean.mjs", `
const before = new Set(process.moduleLoadList);
const durun = await import(${JSON.stringify(sdk)});
await durun.step("plain", { n: 1 }, () => [1, 2]);
await durun.result(null);
const loaded = process.moduleLoadList.filter((name) => !before.has(name) && /^NativeModule (child_process|crypto)$/.test(name));
console.error("loaded:", JSON.stringify(loaded));
`);
  const run = durun(box, ["run", "--task", "l", "--", "node", path]);
  assert.equal(run.code, 0, run.stderr);
  assert.match(run.stderr, /loaded: \[\]/);
  assert.deepEqual(inspect(box, "l").steps[0].output, [1, 2]);
});

test("a short step's commit is in the journal while the agent goes on, and at its exit", () => {
  const box = sandbox();
  // Each short step's commit is written as the step ends: "a" and "b" are
  // committed while the program still runs, "c" by its exit.
  const path = agent(box, `
import { execFileSync } from "node:child_process";
await durun.step("a", {}, () => 1);
await durun.step("b", {}, () => 2);
await new Promise((resolve) => setTimeout(resolve, 300));
const seen = JSON.parse(execFileSync("durun", ["inspect", "t", "--json"], { encoding: "utf8" }));
console.error("while running:", seen.steps.map((step) => step.name + "=" + step.status).join(" "));
await durun.step("c", {}, () => 3);
process.exit(0);
`);
  const run = durun(box, ["run", "--task", "t", "--", "node", path]);
  assert.equal(run.code, 0, run.stderr);
  assert.match(run.stderr, /while running: a=committed b=committed/);
  assert.deepEqual(inspect(box, "t").steps.map((step) => [step.name, step.status]), [
    ["a", "committed"],
    ["b", "committed"],
    ["c", "committed"],
  ]);
});

test("retries journal every attempt under one key", () => {
  const box = sandbox();
  const path = agent(box, `
const keys = [];
const value = await durun.step("flaky", {}, () => {
  keys.push(durun.current().idempotencyKey);
  if (keys.length < 3) throw new Error("not yet");
  return "third time";
}, { effect: "mutate", retries: 2, backoff: 0.01 });
await durun.result({ value, keys });
`);
  const run = durun(box, ["run", "--task", "t", "--", "node", path]);
  assert.equal(run.code, 0, run.stderr);
  const task = inspect(box, "t");
  assert.equal(task.task.output.value, "third time");
  assert.equal(new Set(task.task.output.keys).size, 1);
  assert.equal(task.steps[0].attempts, 3);
  assert.equal(task.steps[0].idempotency_key, task.task.output.keys[0]);
});

test("a changed path is a divergence the agent sees as an error", () => {
  const box = sandbox();
  const path = agent(box, `
import { readFileSync } from "node:fs";
// durun ends a diverged agent with SIGTERM; let it print what it caught first.
process.on("SIGTERM", () => {});
const version = readFileSync("version", "utf8");
try {
  await durun.step("plan", { version }, () => "plan " + version);
} catch (err) {
  console.error("caught", err.name, err.code);
  throw err;
}
process.exit(Number(process.env.EXIT ?? 0));
`);
  box.write("version", "1");
  assert.equal(durun(box, ["run", "--task", "t", "--", "node", path], { EXIT: "3" }).code, 3);
  box.write("version", "2");
  const resumed = durun(box, ["resume", "t"]);
  assert.equal(resumed.code, 65, resumed.stderr);
  assert.match(resumed.stderr, /caught Divergence divergence/);
});

test("an approval parks the task, and the resume after it replays the rest", () => {
  const box = sandbox();
  const path = agent(box, `
const plan = await durun.step("plan", {}, () => "the plan");
const approved = await durun.approval({ plan });
await durun.sleep(0.1);
const first = await durun.now();
const id = await durun.uuid();
await durun.result({ approved, first: first.toISOString(), id, patched: await durun.patched("v2") });
`);
  const parked = durun(box, ["run", "--task", "t", "--park-after", "0s", "--", "node", path]);
  assert.equal(parked.code, 77, parked.stderr);
  assert.equal(durun(box, ["approve", "t"]).code, 0);
  const resumed = durun(box, ["resume", "t"]);
  assert.equal(resumed.code, 0, resumed.stderr);
  const output = inspect(box, "t").task.output;
  assert.equal(output.approved, true);
  assert.equal(output.patched, true);
  const again = durun(box, ["resume", "t", "--from-step", "7"]);
  assert.equal(again.code, 0, again.stderr);
  const replayed = inspect(box, "t").task.output;
  assert.equal(replayed.first, output.first, "now() is the first run's");
  assert.equal(replayed.id, output.id, "uuid() is the first run's");
});

test("a parent spawns children and joins them; a child reads its args", () => {
  const box = sandbox();
  agent(box, `
const topic = durun.childArgs().topic;
const found = await durun.step("research", { topic }, () => topic.toUpperCase());
await durun.result({ found, parent: durun.parentTask() });
`, "child.mjs");
  const path = agent(box, `
const kids = [];
for (const topic of ["x", "y"]) kids.push(await durun.spawn("research " + topic, ["node", "child.mjs"], { topic }));
const joined = await durun.joinAll(kids);
await durun.result(joined.map((j) => [j.task, j.status, j.output.found]));
`);
  const run = durun(box, ["run", "--task", "tree", "--", "node", path]);
  assert.equal(run.code, 0, run.stderr);
  assert.deepEqual(inspect(box, "tree").task.output, [["tree-s1", "completed", "X"], ["tree-s2", "completed", "Y"]]);
  assert.equal(inspect(box, "tree-s2").task.output.parent, "tree");
});

test("a commit durun refuses is thrown at the next request, within 64 short steps, or reported at exit", async () => {
  for (const scenario of ["next", "loop", "exit"]) {
    const box = sandbox();
    const path = agent(box, `
import { existsSync, writeFileSync } from "node:fs";
// durun stops the run when its journal fails (after it answered the
// refused commit): stay to hear why.
let stopped = false;
process.on("SIGTERM", () => { stopped = true; });
await durun.step("a", {}, () => 1);
writeFileSync("ready", "");
while (!existsSync("go")) await new Promise((resolve) => setTimeout(resolve, 10));
// Resolves at once: its commit is posted, and durun will refuse it.
console.error("value", await durun.step("b", {}, () => 2));
if (process.env.SCENARIO === "next") {
  // The next request goes out once durun has refused the commit and
  // stopped the run, however slow the machine.
  for (let i = 0; i < 3000 && !stopped; i++) await new Promise((resolve) => setTimeout(resolve, 10));
  try {
    await durun.step("c", {}, () => 3);
  } catch (err) {
    console.error("caught", err.name, err.message);
  }
}
if (process.env.SCENARIO === "loop") {
  // Steps whose bodies return at once never let the event loop turn: the
  // SDK reads durun's answers itself every so many posts. The commit goes
  // out at the loop's next turn; durun refuses it after its 200 ms busy
  // timeout, well within this wait (and its stop's 5 s grace).
  await new Promise((resolve) => setImmediate(resolve));
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 3000);
  for (let i = 1; i <= 200; i++) {
    try {
      await durun.step("c", { i }, () => 3);
    } catch (err) {
      console.error("caught", err.name, err.message, "after", i);
      break;
    }
  }
}
`);
    const run = spawn(durunBin, ["run", "--task", "t", "--", "node", path], {
      cwd: box.dir,
      env: { ...box.env, SCENARIO: scenario, DURUN_BUSY_TIMEOUT_MS: "200" },
      stdio: ["ignore", "ignore", "pipe"],
    });
    let stderr = "";
    run.stderr.on("data", (chunk) => (stderr += chunk));
    const exited = new Promise((resolve) => run.on("exit", resolve));
    while (!existsSync(join(box.dir, "ready"))) await new Promise((resolve) => setTimeout(resolve, 10));
    // Step a's commit was posted, not waited for: it must be durable
    // before the lock, or it is the one refused.
    for (let i = 0; i < 2000; i++) {
      const shown = durun(box, ["inspect", "t", "--json"]);
      if (shown.code === 0 && JSON.parse(shown.stdout).steps[0]?.status === "committed") break;
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    // Another process holds the journal's write lock past durun's busy timeout.
    const holder = spawn("python3", ["-c", `
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
db.execute("UPDATE tasks SET cwd = cwd")
print("locked", flush=True)
sys.stdin.read()
`, box.env.DURUN_JOURNAL], { stdio: ["pipe", "pipe", "inherit"] });
    await new Promise((resolve) => holder.stdout.once("data", resolve));
    writeFileSync(join(box.dir, "go"), "");
    const code = await exited;
    holder.stdin.end();
    await new Promise((resolve) => holder.on("exit", resolve));
    assert.equal(code, 74, stderr);
    assert.match(stderr, /value 2/);
    if (scenario === "next") {
      assert.match(stderr, /caught JournalError durun could not write the journal/);
    } else if (scenario === "loop") {
      const caught = stderr.match(/caught JournalError durun could not write the journal.* after (\d+)/);
      assert.ok(caught, stderr);
      // Two posts a step, answers read every 128.
      assert.ok(Number(caught[1]) <= 64, stderr);
    } else {
      assert.match(stderr, /durun: the commit of step 2 was refused: durun could not write the journal/);
    }
    const steps = inspect(box, "t").steps;
    assert.deepEqual(steps.map((step) => [step.name, step.status]), [["a", "committed"]]);
  }
});

test("without durun, steps run and tools run through durun call", () => {
  const box = sandbox();
  box.write("durun.toml", '[tools.echo]\neffect = "read"\ncommand = ["echo", "{text}"]\n');
  const path = agent(box, `
let missing;
try {
  await durun.call("missing");
} catch (err) {
  missing = err.constructor.name;
}
console.log(JSON.stringify([durun.active(), await durun.step("s", {}, () => 7), await durun.call("echo", { text: "hi" }), missing]));
`);
  const env = { ...box.env };
  delete env.DURUN_JOURNAL;
  return new Promise((resolve, reject) => {
    const child = spawn("node", [path], { cwd: box.dir, env, stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    child.stdout.on("data", (chunk) => { out += chunk; });
    child.on("close", (code) => {
      try {
        assert.equal(code, 0);
        assert.deepEqual(JSON.parse(out), [false, 7, "hi\n", "NotUnderDurun"]);
        resolve();
      } catch (err) {
        reject(err);
      }
    });
  });
});

test("wrap journals a client's model calls, streams included", () => {
  const box = sandbox();
  box.write("calls", "");
  // A stand-in with the shape of the openai package's client.
  const path = agent(box, `
import { appendFileSync } from "node:fs";
class OpenAI {
  constructor() {
    this.chat = { completions: { create: async (params) => {
      appendFileSync("calls", params.messages[0].content + "\\n");
      if (params.stream) {
        return (async function* () {
          yield { choices: [{ delta: { content: "str" } }] };
          yield { choices: [{ delta: { content: "eamed" } }], usage: { prompt_tokens: 9, completion_tokens: 3 } };
        })();
      }
      return { choices: [{ message: { content: "echo " + params.messages[0].content } }], usage: { prompt_tokens: 90, completion_tokens: 10 } };
    } } };
  }
}
const client = durun.wrap(new OpenAI());
const reply = await client.chat.completions.create({ model: "m", messages: [{ role: "user", content: "hello" }] });
let streamed = "";
for await (const chunk of await client.chat.completions.create({ model: "m", messages: [{ role: "user", content: "stream" }], stream: true })) {
  streamed += chunk.choices[0].delta.content;
}
if (process.env.DURUN_RUN === "1") process.exit(3);
await durun.result({ reply: reply.choices[0].message.content, streamed });
`);
  assert.equal(durun(box, ["run", "--task", "t", "--", "node", path]).code, 3);
  const resumed = durun(box, ["resume", "t"]);
  assert.equal(resumed.code, 0, resumed.stderr);
  assert.equal(readFileSync(join(box.dir, "calls"), "utf8"), "hello\nstream\n", "no call sent twice");
  const task = inspect(box, "t");
  assert.deepEqual(task.task.output, { reply: "echo hello", streamed: "streamed" });
  assert.equal(task.steps[0].name, "openai.chat.completions.create");
  assert.equal(task.steps[0].tokens, 100);
  assert.equal(task.steps[1].tokens, 12);
  assert.equal(task.task.runs[1].tokens_saved, 112);
});

test("wrap works on the real openai package", { skip: !existsSync(join(repo, "sdk", "node", "node_modules", "openai")) && !process.env.DURUN_TEST_LLM_CLIENTS }, async () => {
  const box = sandbox();
  const portFile = join(box.dir, "llm.port");
  const server = spawn("python3", [join(repo, "tests", "agents", "llm_server.py"), portFile], { stdio: "inherit" });
  try {
    for (let i = 0; i < 200 && !existsSync(portFile); i++) await new Promise((resolve) => setTimeout(resolve, 50));
    const port = readFileSync(portFile, "utf8");
    const path = agent(box, `
import OpenAI from ${JSON.stringify(join(repo, "sdk", "node", "node_modules", "openai", "index.mjs"))};
const client = durun.wrap(new OpenAI({ baseURL: "http://127.0.0.1:${port}/v1", apiKey: "k", maxRetries: 0 }));
const reply = await client.chat.completions.create({ model: "m", messages: [{ role: "user", content: "plan" }] });
let streamed = "";
const stream = await client.chat.completions.create({ model: "m", messages: [{ role: "user", content: "stream" }], stream: true, stream_options: { include_usage: true } });
const [left, right] = stream.tee();
for await (const chunk of left) streamed += chunk.choices[0]?.delta?.content ?? "";
// The client's Stream surface: its newline-separated JSON, as the client writes it.
const lines = (await new Response(right.toReadableStream()).text()).trim().split("\\n").map((line) => JSON.parse(line));
const response = await client.responses.create({ model: "m", input: "respond" });
// The answer as the client itself returns it: the same object as a direct call's.
const direct = await new OpenAI({ baseURL: "http://127.0.0.1:${port}/v1", apiKey: "k", maxRetries: 0 }).chat.completions.create({ model: "m", messages: [{ role: "user", content: "direct" }] });
const shape = (value) => Object.keys(value).sort().join(",");
if (shape(reply) !== shape(direct) || typeof reply.choices[0].message !== "object") throw new Error("not the client's shape");
if (!(stream.controller instanceof AbortController)) throw new Error("no controller");
if (process.env.DURUN_RUN === "1") process.exit(3);
await durun.result({ reply: reply.choices[0].message.content, streamed: streamed.trim(), response: response.output_text, lines: lines.length > 0 && lines.every((line) => "choices" in line) });
`);
    const first = durun(box, ["run", "--task", "t", "--", "node", path]);
    assert.equal(first.code, 3, first.stderr);
    const resumed = durun(box, ["resume", "t"]);
    assert.equal(resumed.code, 0, resumed.stderr);
    const counts = JSON.parse(readFileSync(portFile + ".count", "utf8"));
    // Each journaled call once; the direct (unwrapped) call on each run.
    assert.deepEqual(Object.values(counts), [1, 1, 1, 2], JSON.stringify(counts));
    assert.deepEqual(inspect(box, "t").task.output, { reply: "echo: plan", streamed: "echo: stream", response: "echo: respond", lines: true });
  } finally {
    server.kill();
  }
});

test("a new step after durun closed the protocol is refused before its body runs", () => {
  const box = sandbox();
  const path = agent(box, `
const ran = [];
await durun.step("first", {}, () => ran.push("first")).catch(() => {});
// The closed pipe is seen by now.
await new Promise((resolve) => setTimeout(resolve, 200));
try {
  await durun.step("second", {}, () => ran.push("second"));
  console.error("second: returned");
} catch (err) {
  console.error("second:", err.message);
}
console.error("ran:", JSON.stringify(ran));
`);
  // This test is durun's end of the protocol: it says the journal held no
  // step (every \`read\` step is new, its \`begin\` posted) and closes the
  // agent's stdin at once.
  const run = spawnSync(process.execPath, [path], {
    cwd: box.dir,
    env: { ...box.env, DURUN_PROTOCOL: "1", DURUN_TASK_ID: "t", DURUN_JOURNAL_STEPS: "0" },
    input: "",
    encoding: "utf8",
    timeout: 30_000,
  });
  assert.equal(run.status, 0, run.stderr);
  assert.match(run.stderr, /second: .*durun closed the protocol/);
  assert.match(run.stderr, /ran: \["first"\]/, "the second step's body did not run");
});
