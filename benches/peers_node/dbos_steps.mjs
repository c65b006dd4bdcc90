// DBOS Transact for TypeScript (@dbos-inc/dbos-sdk), the same workflow as
// the Python peers in ../peers: one workflow running N steps, each
// appending "<pid> <i>" to a counter file and returning {i, payload}. DBOS
// for TypeScript keeps its system database on PostgreSQL only.
//
//   node dbos_steps.mjs --steps 1000 --url postgresql://postgres@127.0.0.1:5432/durun_bench_dbos --counter FILE
//
// Prints one JSON line: {"us_per_step": …, "ok": true}.
import { openSync, rmSync, writeSync } from "node:fs";
import { parseArgs } from "node:util";
import { DBOS } from "@dbos-inc/dbos-sdk";

const { values } = parseArgs({
  options: { steps: { type: "string" }, url: { type: "string" }, counter: { type: "string" } },
});
const steps = Number(values.steps);
rmSync(values.counter, { force: true });
const counter = openSync(values.counter, "a");

async function body(i) {
  writeSync(counter, `${process.pid} ${i}\n`);
  return { i, payload: "x".repeat(100) };
}
const workflow = DBOS.registerWorkflow(
  async (n) => {
    let last;
    for (let i = 1; i <= n; i++) last = await DBOS.runStep(() => body(i), { name: "step" });
    return { last_i: last.i };
  },
  { name: "bench" },
);
DBOS.setConfig({ name: "peers-bench", systemDatabaseUrl: values.url, logLevel: "warn" });
await DBOS.launch();
const started = process.hrtime.bigint();
const out = await workflow(steps);
const elapsed = Number(process.hrtime.bigint() - started);
await DBOS.shutdown();
console.log(JSON.stringify({ us_per_step: elapsed / 1000 / steps, ok: out.last_i === steps }));
