// LangGraph.js with its SQLite checkpointer (@langchain/langgraph-checkpoint-sqlite),
// the same workflow as the Python peers in ../peers: N sequential
// tasks of the functional API, each appending "<pid> <i>" to a counter
// file and returning {i, payload}. durability "sync": each task's result
// is saved before the workflow goes on.
//
//   node langgraph_steps.mjs --steps 1000 --db /tmp/p/lg.sqlite [--synchronous normal]
//
// Prints one JSON line: {"us_per_step": …, "ok": true}.
import { openSync, rmSync, writeSync } from "node:fs";
import { parseArgs } from "node:util";
import { entrypoint, task } from "@langchain/langgraph";
import { SqliteSaver } from "@langchain/langgraph-checkpoint-sqlite";

const { values } = parseArgs({
  options: { steps: { type: "string" }, db: { type: "string" }, synchronous: { type: "string" } },
});
const steps = Number(values.steps);
for (const suffix of ["", "-wal", "-shm", ".counter"]) rmSync(values.db + suffix, { force: true });
const counter = openSync(`${values.db}.counter`, "a");

const saver = SqliteSaver.fromConnString(values.db);
if (values.synchronous) saver.db.pragma(`synchronous = ${values.synchronous}`);
const step = task("step", async (i) => {
  writeSync(counter, `${process.pid} ${i}\n`);
  return { i, payload: "x".repeat(100) };
});
const workflow = entrypoint({ checkpointer: saver, name: "bench" }, async (n) => {
  let last;
  for (let i = 1; i <= n; i++) last = await step(i);
  return { last_i: last.i };
});
const config = { configurable: { thread_id: "peers-bench-thread" }, durability: "sync", recursionLimit: steps + 10 };
const started = process.hrtime.bigint();
const out = await workflow.invoke(steps, config);
const elapsed = Number(process.hrtime.bigint() - started);
console.log(JSON.stringify({ us_per_step: elapsed / 1000 / steps, ok: out.last_i === steps }));
