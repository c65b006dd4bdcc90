"""Memory of durun with N concurrent streams through its model proxy.

    cargo build --release
    python3 benches/proxy_streams.py [N]        # default 1000

Starts an upstream on loopback that sends each stream's first event at
once and the rest only once released; runs an agent under `durun run`
that opens N streaming chat completions through OPENAI_BASE_URL (the
proxy) at once. durun serves at most 256 connections at once (SPEC 17),
the rest wait in its queue: when min(N, 256) streams have their first
event, the agent counts durun's open descriptors and releases the
streams, and reads them all to their end. Prints N, durun's peak
resident memory (VmHWM of the agent's parent, at the end), its
descriptors with every served stream open, and whether every stream was
recorded as a step."""

import asyncio
import json
import os
import subprocess
import sys
import tempfile

N = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DURUN = os.environ.get("DURUN_BIN", os.path.join(ROOT, "target/release/durun"))

AGENT = r'''
import asyncio, json, os, sys
n = int(os.environ["STREAMS"])
base = os.environ["OPENAI_BASE_URL"]
host, rest = base.split("//", 1)[1].split("/", 1)
hostname, port = host.split(":")

async def stream(i, first):
    reader, writer = await asyncio.open_connection(hostname, int(port))
    body = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": f"s{i}"}]})
    writer.write((f"POST /{rest}/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  f"content-length: {len(body)}\r\n\r\n{body}").encode())
    await writer.drain()
    data = b""
    while b"data:" not in data:
        more = await reader.read(65536)
        if not more:
            break
        data += more
    first.set_result(None) if not first.done() else None
    while b"[DONE]" not in data:
        more = await reader.read(65536)
        if not more:
            break
        data += more
    writer.close()
    return b"[DONE]" in data

async def main():
    firsts = [asyncio.get_running_loop().create_future() for _ in range(n)]
    tasks = [asyncio.create_task(stream(i, firsts[i])) for i in range(n)]
    served = min(n, 256)
    while sum(first.done() for first in firsts) < served:
        await asyncio.sleep(0.01)
    durun = os.environ["DURUN_PID"]
    fds = len(os.listdir(f"/proc/{durun}/fd"))
    open(os.environ["RELEASE"], "w").close()
    done = await asyncio.gather(*tasks)
    status = open(f"/proc/{durun}/status").read()
    peak = next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1]
    print(json.dumps({"peak_kib": int(peak), "fds": fds, "complete": sum(done)}))

asyncio.run(main())
'''


async def upstream(release, ready):
    async def serve(reader, writer):
        head = b""
        while b"\r\n\r\n" not in head:
            head += await reader.read(65536)
        length = int([line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")][0])
        body = head.split(b"\r\n\r\n", 1)[1]
        while len(body) < length:
            body += await reader.read(65536)
        # It closes the connection after the answer: said, so that durun's
        # client does not send the next request on it.
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
                     b"connection: close\r\n\r\n")

        def chunk(data):
            event = f"data: {data}\n\n".encode()
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))

        delta = {"choices": [{"index": 0, "delta": {"content": "hello " * 20}}]}
        chunk(json.dumps(delta))
        await writer.drain()
        while not os.path.exists(release):
            await asyncio.sleep(0.05)
        for _ in range(20):
            chunk(json.dumps(delta))
        chunk(json.dumps({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 20}}))
        chunk("[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, backlog=4096)
    ready.set_result(server.sockets[0].getsockname()[1])
    async with server:
        await server.serve_forever()


async def main():
    work = tempfile.mkdtemp(prefix="durun-streams-")
    release = os.path.join(work, "release")
    ready = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(upstream(release, ready))
    port = await ready
    agent = os.path.join(work, "agent.py")
    open(agent, "w").write(AGENT)
    env = dict(os.environ, OPENAI_BASE_URL=f"http://127.0.0.1:{port}/v1", STREAMS=str(N), RELEASE=release,
               DURUN_JOURNAL=os.path.join(work, "journal.db"))
    process = await asyncio.create_subprocess_exec(
        DURUN, "-q", "run", "--task", "streams", "--", sys.executable, agent, env=env,
        stdout=subprocess.PIPE)
    out, _ = await process.communicate()
    server.cancel()
    result = json.loads(out.decode().strip().splitlines()[-1])
    steps = subprocess.run([DURUN, "inspect", "streams", "--json"], env=env, capture_output=True, text=True)
    recorded = len(json.loads(steps.stdout)["steps"])
    print(f"{N} concurrent streams: durun's peak resident memory {result['peak_kib'] / 1024:.1f} MB; "
          f"{result['fds']} descriptors open with {min(N, 256)} served; "
          f"{result['complete']} complete, {recorded} recorded as steps")


asyncio.run(main())
