// durun's wrap of LLM clients (openai, @anthropic-ai/sdk): each model
// call a journaled step, streams recorded and replayed.
import { step, usage } from "./index.js";

const ENDPOINTS = [["chat", "completions", "create"], ["responses", "create"], ["messages", "create"]];

async function collect(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(JSON.parse(JSON.stringify(chunk)));
  let input = 0;
  let output = 0;
  for (const chunk of chunks) {
    const found = chunk?.usage ?? chunk?.message?.usage;
    if (found) {
      input = Math.max(input, found.prompt_tokens ?? found.input_tokens ?? 0);
      output = Math.max(output, found.completion_tokens ?? found.output_tokens ?? 0);
    }
  }
  usage(input, output);
  return { stream: chunks };
}

/**
 * A recorded stream with the surface of the clients' own `Stream`: async
 * iteration, `tee()`, `toReadableStream()` (newline-separated JSON, as the
 * clients write it) and `controller`. Its chunks are what the client
 * yielded: plain objects, as the clients parse them.
 */
class RecordedStream {
  constructor(chunks, controller = new AbortController()) {
    this.chunks = chunks;
    this.controller = controller;
  }

  async *[Symbol.asyncIterator]() {
    yield* this.chunks;
  }

  tee() {
    return [new RecordedStream(this.chunks, this.controller), new RecordedStream(this.chunks, this.controller)];
  }

  toReadableStream() {
    const encoder = new TextEncoder();
    const chunks = this.chunks;
    let next = 0;
    return new ReadableStream({
      pull(ctrl) {
        if (next >= chunks.length) return ctrl.close();
        ctrl.enqueue(encoder.encode(JSON.stringify(chunks[next++]) + "\n"));
      },
    });
  }
}

function replayStream(chunks) {
  return new RecordedStream(chunks);
}

/**
 * Journals every model call of an `openai` or `@anthropic-ai/sdk` client:
 * `chat.completions.create`, `responses.create` and `messages.create`
 * become `read` steps named like `openai.chat.completions.create`, with
 * their usage. An answer comes back as the client returns it (a plain
 * object, parsed from the recorded JSON), on the first run and on a
 * replay alike; a stream (`stream: true`) is consumed inside the step and
 * comes back with the surface of the client's `Stream` (async iteration,
 * `tee()`, `toReadableStream()`, `controller`) over the same chunks.
 */
export function wrap(client, provider) {
  const name = provider ?? (client?.constructor?.name === "Anthropic" ? "anthropic" : "openai");
  const proxy = (target, path) =>
    new Proxy(target, {
      get(object, attr, receiver) {
        const value = Reflect.get(object, attr, receiver);
        if (typeof attr !== "string") return value;
        const next = [...path, attr];
        const matches = (endpoint) => next.every((part, index) => endpoint[index] === part);
        if (ENDPOINTS.some((endpoint) => endpoint.length === next.length && matches(endpoint)) && typeof value === "function") {
          const stepName = `${name}.${next.join(".")}`;
          return async (params = {}, ...rest) => {
            const streaming = params.stream === true;
            const recorded = await step(stepName, params, async () => {
              const response = await value.call(object, params, ...rest);
              return streaming ? collect(response) : JSON.parse(JSON.stringify(response));
            });
            return streaming ? replayStream(recorded.stream) : recorded;
          };
        }
        if (ENDPOINTS.some(matches) && value && typeof value === "object") return proxy(value, next);
        return value;
      },
    });
  return proxy(client, []);
}
