// Runs one new `read` step per line of JSON args in argv[2], whose body
// reads its idempotency key: derived by the SDK itself (its `begin` is
// posted), then checked against durun's. Writes {"checked": N, "skipped":
// [...], "mismatches": [...]} to argv[3]: a text JavaScript cannot hold
// (an integer past a double's range) is skipped, by the SDK's own refusal.
import { readFileSync, writeFileSync } from "node:fs";
import * as durun from "../../sdk/node/index.js";

const texts = readFileSync(process.argv[2], "utf8").split("\n").filter((text) => text);
const report = { checked: 0, skipped: [], mismatches: [] };
for (const text of texts) {
  const args = JSON.parse(text);
  try {
    const key = await durun.step("k", args, () => durun.current().idempotencyKey);
    if (typeof key !== "string" || key.length !== 64) throw new Error(`no key: ${key}`);
    report.checked++;
  } catch (err) {
    if (err instanceof TypeError) report.skipped.push(text);
    else report.mismatches.push({ text, error: String(err) });
  }
}
await durun.result(null);
writeFileSync(process.argv[3], JSON.stringify(report));
