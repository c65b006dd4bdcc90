// What the SDK's tests share: the durun binary, a fresh journal, the fake
// services, and runs of durun.
import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync, writeFileSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { createServer } from "node:net";

export const repo = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
export const durunBin = process.env.DURUN_BIN ?? join(repo, "target", "debug", "durun");

if (!existsSync(durunBin)) {
  throw new Error(`no durun at ${durunBin}: run \`cargo build\` first, or set DURUN_BIN`);
}

/** A directory of its own, with a journal in it. */
export function sandbox() {
  const dir = mkdtempSync(join(tmpdir(), "durun-node-"));
  return {
    dir,
    env: {
      PATH: `${dirname(durunBin)}:${process.env.PATH}`,
      HOME: dir,
      DURUN_JOURNAL: join(dir, "journal.db"),
    },
    write(name, text) {
      const path = join(dir, name);
      writeFileSync(path, text);
      return path;
    },
  };
}

/** Runs durun to its end: {code, stdout, stderr}. */
export function durun(box, args, extraEnv = {}) {
  const done = spawnSync(durunBin, args, {
    cwd: box.dir,
    env: { ...box.env, ...extraEnv },
    encoding: "utf8",
    timeout: 120_000,
  });
  return { code: done.status, stdout: done.stdout, stderr: done.stderr };
}

export function inspect(box, task) {
  const shown = durun(box, ["inspect", task, "--json"]);
  if (shown.code !== 0) throw new Error(shown.stderr);
  return JSON.parse(shown.stdout);
}

async function freePort() {
  return new Promise((resolve) => {
    const server = createServer();
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

/** examples/fake_services.py on a free port. */
export async function fakeServices() {
  const port = await freePort();
  const child = spawn("python3", [join(repo, "examples", "fake_services.py")], {
    env: { ...process.env, FAKE_PORT: String(port) },
    stdio: ["ignore", "pipe", "inherit"],
  });
  await new Promise((resolve) => child.stdout.once("data", resolve));
  return {
    port,
    async stats(task) {
      const query = task === undefined ? "" : `?task=${encodeURIComponent(task)}`;
      return (await fetch(`http://127.0.0.1:${port}/stats${query}`)).json();
    },
    stop() {
      child.kill();
    },
  };
}

/** The SDK's entry point, for agents written in a test. */
export const sdk = join(repo, "sdk", "node", "index.js");
