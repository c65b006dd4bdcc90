// Short steps through the Node SDK, each followed at once by a model call
// the SDK knows nothing of (plain `fetch` through durun's proxy): each call
// must be a step of its own, never counted into the step before it.
// Writes $REACHED after the last call and ends once $RELEASE exists.
import { existsSync, writeFileSync } from "node:fs";
import * as durun from "../../sdk/node/index.js";

const calls = Number(process.argv[2]);
for (let i = 0; i < calls; i++) {
  await durun.step("quick", { i }, () => i);
  const answer = await fetch(`${process.env.OPENAI_BASE_URL}/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: "Bearer test" },
    body: JSON.stringify({ model: "m", messages: [{ role: "user", content: `call ${i}` }] }),
  });
  if (!answer.ok) throw new Error(`call ${i}: HTTP ${answer.status}`);
  await answer.json();
}
writeFileSync(process.env.REACHED, "");
while (!existsSync(process.env.RELEASE)) await new Promise((resolve) => setTimeout(resolve, 10));
await durun.result(calls);
