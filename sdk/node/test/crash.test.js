// The design's crash test, through the JavaScript SDK: durun is killed
// with SIGKILL inside step 4 (a pull request that took effect), and the
// resume answers steps 1-3 from the journal, retries step 4 with its key,
// and runs the rest.
import { test } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";

import { durun, fakeServices, inspect, repo, sandbox } from "./helpers.js";

test("the node agent survives SIGKILL inside step 4", async () => {
  const services = await fakeServices();
  try {
    const box = sandbox();
    const env = { FAKE_PORT: String(services.port) };
    const agent = join(repo, "examples", "node-agent", "agent.mjs");
    const first = durun(box, ["run", "--task", "demo", "--", "node", agent], { ...env, CRASH_IN: "open_pull" });
    assert.equal(first.code, null, "durun itself was killed"); // by SIGKILL: no exit code
    let stats = await services.stats();
    assert.equal(stats.llm_calls, 3);
    assert.equal(stats.pulls, 1);

    const resumed = durun(box, ["resume", "demo"], env);
    assert.equal(resumed.code, 0, resumed.stderr);
    assert.match(resumed.stderr, /agent: opened https:\/\/git\.example\/pulls\/1/);
    stats = await services.stats();
    assert.equal(stats.llm_calls, 4, "steps 1-3 from the journal, step 5 new");
    assert.equal(stats.pulls, 1, "step 4 retried with its key: no second pull request");

    // The same counts for this task alone, after another task's calls
    // (the README's `/stats?task=` after the Python example).
    const other = durun(box, ["run", "--task", "other", "--", "node", agent], env);
    assert.equal(other.code, 0, other.stderr);
    const own = await services.stats("demo");
    assert.equal(own.llm_calls, 4, "this task's model calls only");
    assert.equal(own.pulls, 1);

    const task = inspect(box, "demo");
    const step4 = task.steps[3];
    assert.equal(step4.name, "open_pull");
    assert.equal(step4.attempts, 2);
    assert.equal(stats.keys[step4.idempotency_key], 2, "both attempts carried the same key");
    assert.equal(task.steps.length, 8);
    const run2 = task.task.runs[1];
    assert.equal(run2.replayed_steps, 3);
    const saved = run2.tokens_saved / (run2.tokens_saved + run2.tokens_spent);
    assert.ok(saved > 0.7, `saved ${run2.tokens_saved} of ${run2.tokens_saved + run2.tokens_spent} tokens`);
  } finally {
    services.stop();
  }
});
