// The bench's workflow as agent authors write it in JavaScript: a plain
// loop of `durun.step` through the Node SDK, the same work as
// sdk_agent.py. The time includes settling: until durun has answered
// every step, so a backlog in durun is not hidden. With DURUN_BENCH_WARMUP
// set, that many steps (named otherwise) run first, untimed, so that V8
// has compiled the SDK, as in a long-running agent. Writes it to
// DURUN_BENCH_OUT; exits with DURUN_BENCH_EXIT.
import { appendFileSync, openSync, writeFileSync } from "node:fs";
import * as durun from "../../sdk/node/index.js";

const steps = Number(process.env.DURUN_BENCH_STEPS);
const effect = process.env.DURUN_BENCH_EFFECT ?? "read";
const warmup = Number(process.env.DURUN_BENCH_WARMUP ?? "0");
const counter = openSync("counter", "a");

function body(i) {
  appendFileSync(counter, `${process.pid} ${i}\n`);
  return { i, payload: "x".repeat(100) };
}

for (let i = 1; i <= warmup; i++) {
  await durun.step("warm-up", { i }, () => body(-i), { effect });
}
const started = process.hrtime.bigint();
for (let i = 1; i <= steps; i++) {
  await durun.step("step", { i }, () => body(i), { effect });
}
await durun.result(null);
const elapsed = process.hrtime.bigint() - started;
writeFileSync(process.env.DURUN_BENCH_OUT, JSON.stringify({ elapsed_ns: Number(elapsed) }));
process.exit(Number(process.env.DURUN_BENCH_EXIT ?? "0"));
