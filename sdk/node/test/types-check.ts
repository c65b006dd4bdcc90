// Compiled, never run, by `.ci/run` (tsc --noEmit --strict): the types in
// index.d.ts describe the SDK as agents use it.
import * as durun from "../index.js";

interface Plan {
  steps: string[];
}

async function agent(): Promise<void> {
  const plan: Plan = await durun.step("plan", { prompt: "p" }, async () => ({ steps: ["a"] }));
  const key: string | undefined = durun.current()?.idempotencyKey;
  const outputs: string[] = await durun.callAll<string>([["echo", { text: "a" }]]);
  const signal: durun.Signal = await durun.wait("go", { plan }, { timeout: "1h" });
  const approved: boolean = await durun.approval({ plan });
  await durun.sleep(new Date());
  const when: Date = await durun.now();
  const patched: boolean = await durun.patched("v2");
  const client = durun.wrap({ chat: { completions: { create: async (params: object) => params } } });
  await client.chat.completions.create({ model: "m" });
  try {
    await durun.step("x", {}, () => 1, { effect: "mutate", retries: 2, backoff: 0.5, timeout: 10 });
  } catch (err) {
    if (err instanceof durun.BudgetExceeded) console.error(err.code, err.step);
  }
  const kid: string = await durun.spawn("research", ["node", "child.mjs"], { topic: "x" }, { queue: "kids" });
  const joined: durun.Joined[] = await durun.joinAll([kid]);
  const status: "completed" | "failed" | "cancelled" = (await durun.join(kid)).status;
  const childArgs = durun.childArgs<{ topic: string }>();
  const parent: string | null = durun.parentTask();
  await durun.result({ plan, key: key ?? null, outputs, signal: signal.data, approved, when: when.toISOString(), patched,
    joined: joined.length, status, topic: childArgs?.topic ?? null, parent });
}

void agent;
