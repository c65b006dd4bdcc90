// Three model steps gathered at once through the Node SDK, each a POST to
// LLM_URL whose answer reports token usage. On its first run the agent
// kills durun with SIGKILL the moment `Promise.all` resolves, then waits to
// die with it; on resume it writes the answers to ANSWERS_FILE, and none of the three calls may be sent again.
import { writeFileSync } from "node:fs";
import * as durun from "../../sdk/node/index.js";

async function ask(prompt) {
  const reply = await fetch(process.env.LLM_URL, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt }),
  });
  return reply.json();
}

const answers = await Promise.all(["a", "b", "c"].map((part) => durun.step(`model ${part}`, { prompt: part }, () => ask(part))));
if (process.env.DURUN_RUN === "1") {
  process.kill(Number(process.env.DURUN_PID), "SIGKILL");
  await new Promise((resolve) => setTimeout(resolve, 30000));
}
writeFileSync(process.env.ANSWERS_FILE, JSON.stringify(answers.map((answer) => answer.text)));
