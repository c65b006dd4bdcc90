// The Node twin of replayed_here.py (same scenarios, same `seen:` lines):
// steps replayed by the SDK itself from durun's `ahead` answers.

import * as durun from "../../sdk/node/index.js";

const run = Number(process.env.DURUN_RUN);
const [scenario, countText, changedText] = process.argv.slice(2);
const count = Number(countText);
const seen = (value) => process.stderr.write(`seen: ${JSON.stringify(value)}\n`);

if (scenario === "loop" || scenario === "diverge") {
  const changed = scenario === "diverge" && run > 1 ? Number(changedText) : 0;
  const runs = [];
  for (let i = 1; i <= count; i++) {
    const args = i === changed ? { i, changed: true } : { i };
    runs.push((await durun.step("s", args, () => ({ run, text: "x".repeat(50) }))).run);
  }
  seen(runs);
} else if (scenario === "gather") {
  const ran = async () => run;
  const two = async (n) => [await durun.step("first", { n }, ran), await durun.step("second", { n }, ran)];
  const one = (name, n) => durun.step(name, { n }, ran);
  const got = [];
  for (let n = 0; n < count; n++) got.push(await Promise.all([two(n), one("left", n), one("right", n)]));
  seen(got);
}
process.exitCode = run === 1 ? 3 : 0;
