// The Node twin of every_op.py: every op of durun's protocol through the
// Node SDK's own encoders, for tests/integration/conformance.rs.

import * as durun from "../../sdk/node/index.js";

const run = Number(process.env.DURUN_RUN);

for (let i = 0; i < 3; i++) await durun.step("read", { i }, () => ({ i }));
await durun.step("open-pr", { branch: "fix" }, () => ({ url: "https://example.test/pull/7" }), { effect: "mutate" });
let tries = 0;
await durun.step(
  "flaky",
  {},
  () => {
    tries += 1;
    if (tries === 1) throw new Error("the first try fails");
    return "second try";
  },
  { retries: 1, backoff: 0.01 },
);
await durun.call("echo", { text: "hi" });
await durun.patched("prompt-2");
await durun.sleep(0.01);
// A moment already past: a changed `until` on the resume would be divergence.
await durun.sleep(new Date("2026-01-01T00:00:00Z"));
const child = await durun.spawn("child", ["true"], { topic: "x" });
await durun.join(child, { timeout: 60 });
if (run === 1) process.exit(3);
await durun.wait("go", { asked: "deploy?" }, { timeout: 60 });
await durun.result({ done: true });
