// An agent on the real `openai` npm package that has never heard of
// durun: the client reads OPENAI_BASE_URL as usual. A chat, a stream, the
// Responses API; then it waits for HOLD_FILE (where a test kills durun)
// and prints what the model said.
const fs = require("node:fs");
const OpenAI = require("openai");

async function main() {
  const client = new OpenAI({ apiKey: "sk-node-secret", maxRetries: 0 });
  const said = [];
  const reply = await client.chat.completions.create({
    model: "m",
    messages: [{ role: "user", content: "node plan" }],
  });
  said.push(reply.choices[0].message.content);
  const stream = await client.chat.completions.create({
    model: "m",
    messages: [{ role: "user", content: "node stream" }],
    stream: true,
    stream_options: { include_usage: true },
  });
  let text = "";
  for await (const chunk of stream) {
    if (chunk.choices.length) text += chunk.choices[0].delta.content || "";
  }
  said.push(text.trim());
  const response = await client.responses.create({ model: "m", input: "node respond" });
  said.push(response.output_text);
  const hold = process.env.HOLD_FILE;
  if (hold) {
    fs.writeFileSync(hold + ".reached", "");
    while (!fs.existsSync(hold)) await new Promise((resolve) => setTimeout(resolve, 20));
  }
  console.log(said.join(" | "));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
