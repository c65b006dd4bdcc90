// An agent in JavaScript through the durun SDK: three model calls, a pull
// request (a `mutate` step with the step's idempotency key), a review, a
// webhook, a tool and a final step. Against examples/fake_services.py:
//
//   python3 examples/fake_services.py &
//   CRASH_IN=open_pull durun run --task demo-js -- node agent.mjs   # dies inside step 4
//   durun resume demo-js                                             # steps 1-3 from the journal
//
// In your own project: `npm install ./sdk/node` and `import * as durun from "durun"`.
import * as durun from "../../sdk/node/index.js";

const base = `http://127.0.0.1:${process.env.FAKE_PORT ?? "8765"}`;

async function post(path, body, headers = {}) {
  const reply = await fetch(base + path, {
    method: "POST",
    // The fake services count each task's requests apart (`/stats?task=`).
    headers: { "content-type": "application/json", "x-durun-task": process.env.DURUN_TASK_ID ?? "", ...headers },
    body: JSON.stringify(body),
  });
  return reply.json();
}

function crashHere(name) {
  // Dies with its durun inside the step, once, as an OOM kill of the run
  // would: the resume must not repeat it. The agent kills itself too: left
  // to its keeper, it would live on a moment, and a step that does not wait
  // for durun's answer (a new `read` step) could start its model call.
  if (process.env.CRASH_IN === name && process.env.DURUN_RUN === "1") {
    process.kill(Number(process.env.DURUN_PID), "SIGKILL");
    process.kill(process.pid, "SIGKILL");
  }
}

async function ask(name, prompt) {
  return durun.step(name, { prompt }, async () => {
    const answer = await post("/llm", { prompt });
    durun.usage(answer.usage.input_tokens, answer.usage.output_tokens);
    return answer.text;
  });
}

const plan = await ask("llm.plan", "plan a fix for the typo in README.md");
const research = await ask("llm.research", "find where the typo is");
const draft = await ask("llm.draft", `draft the fix: ${plan}`);
const pull = await durun.step("open_pull", { title: "Fix typo in README" }, async () => {
  const opened = await post("/pulls", { title: "Fix typo in README", body: draft },
    { authorization: "Bearer demo-token", "idempotency-key": durun.current().idempotencyKey });
  crashHere("open_pull");
  return opened;
}, { effect: "mutate" });
const review = await ask("llm.review", `review ${pull.url}`);
await durun.step("notify", { pull: pull.url }, () =>
  post("/notify", { text: `opened ${pull.url}` }, { "idempotency-key": durun.current().idempotencyKey }),
{ effect: "mutate" });
const words = await durun.step("count", { research }, () => research.split(" ").length);
const summary = await durun.step("summary", { words }, () => `${words} words of research; ${review}`);
await durun.result({ pull: pull.url, summary });
console.log(`agent: opened ${pull.url}`);
