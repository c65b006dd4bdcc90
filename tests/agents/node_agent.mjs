// An agent in JavaScript that speaks durun's protocol, written from
// docs/protocol.md alone: it plans (a read step it runs itself), publishes
// (a mutate step it runs itself, with the step's key), calls a tool, and
// stores a result. It checks each key against the formula in the doc, and
// kills its durun once, right after the publish took effect, when
// CRASH_ONCE names a file that does not exist yet.
import { createInterface } from "node:readline";
import { createHash } from "node:crypto";
import { existsSync, writeFileSync, appendFileSync } from "node:fs";

const input = createInterface({ input: process.stdin });
const lines = input[Symbol.asyncIterator]();
let nextId = 1;

async function ask(message) {
  message.id = nextId++;
  process.stdout.write(JSON.stringify(message) + "\n");
  const { value, done } = await lines.next();
  if (done) {
    console.error("agent: durun closed the protocol");
    process.exit(3);
  }
  const answer = JSON.parse(value);
  if (answer.id !== message.id) throw new Error(`answer for ${answer.id}, asked ${message.id}`);
  if (!answer.ok) {
    console.error(`agent: ${answer.error.code}: ${answer.error.message}`);
    process.exit(3);
  }
  return answer;
}

// Python's json.dumps(value, sort_keys=True) for strings, integers, booleans,
// null, arrays and objects (the doc's canonical form).
function canonical(value) {
  if (value === null) return "null";
  if (Array.isArray(value)) return "[" + value.map(canonical).join(", ") + "]";
  if (typeof value === "object") {
    const keys = Object.keys(value).sort();
    return "{" + keys.map((k) => canonical(k) + ": " + canonical(value[k])).join(", ") + "}";
  }
  if (typeof value === "string") {
    let out = '"';
    for (const unit of value.split("").map((c) => c.charCodeAt(0))) {
      const c = String.fromCharCode(unit);
      if (c === '"') out += '\\"';
      else if (c === "\\") out += "\\\\";
      else if (c === "\n") out += "\\n";
      else if (c === "\r") out += "\\r";
      else if (c === "\t") out += "\\t";
      else if (unit >= 0x20 && unit <= 0x7e) out += c;
      else out += "\\u" + unit.toString(16).padStart(4, "0");
    }
    return out + '"';
  }
  return String(value);
}

function key(step, args) {
  const text = `${process.env.DURUN_TASK_ID}:${step}:${canonical(args)}`;
  return createHash("sha256").update(text, "utf8").digest("hex");
}

function checkKey(answer, args) {
  if (answer.idempotency_key && answer.idempotency_key !== key(answer.step, args)) {
    throw new Error(`key of step ${answer.step} differs from the doc's formula`);
  }
}

const planArgs = { prompt: "Plan the release", max_tokens: 200, note: "été ✓" };
const plan = await ask({ op: "begin", name: "llm.plan", args: planArgs });
checkKey(plan, planArgs);
let planText = plan.output;
if (!plan.replayed) {
  planText = "1. tag 2. notes";
  await ask({ op: "commit", step: plan.step, output: planText,
              usage: { input_tokens: 12, output_tokens: 8 } });
}

const publishArgs = { title: "Release 1.4.0" };
const publish = await ask({ op: "begin", name: "publish", args: publishArgs, effect: "mutate" });
checkKey(publish, publishArgs);
let published = publish.output;
if (!publish.replayed) {
  const reply = await fetch(process.env.API_URL, {
    method: "POST",
    headers: { "Content-Type": "application/json", "Idempotency-Key": publish.idempotency_key },
    body: JSON.stringify(publishArgs),
  });
  published = await reply.json();
  appendFileSync("publish.log", `${publish.attempt} ${publish.in_doubt === true}\n`);
  if (process.env.CRASH_ONCE && !existsSync(process.env.CRASH_ONCE)) {
    writeFileSync(process.env.CRASH_ONCE, "");
    process.kill(Number(process.env.DURUN_PID), "SIGKILL");
    await new Promise(() => {});
  }
  await ask({ op: "commit", step: publish.step, output: published });
}

const echo = await ask({ op: "call", tool: "echo", args: { text: planText } });
checkKey(echo, { text: planText });
console.log("a print is not a request");
await ask({ op: "result", output: { plan: planText, published, echo: echo.output } });
// durun keeps the agent's stdin open: stop listening, or Node waits on it.
input.close();
