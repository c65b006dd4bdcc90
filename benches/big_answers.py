"""durun's memory while a 1 GiB answer passes through it (SPEC 17): the
proxy with a plain answer (Content-Length), a chunked one, and an event
stream, and `durun mcp` with a 1 GiB message from its server (over
`[mcp] max_message`, so refused, never held). Prints durun's peak resident
memory (VmHWM) for each, against the 150 MB the SPEC allows.

    cargo build --release
    python3 benches/big_answers.py target/release/durun

Env: SIZE (bytes, default 1 GiB)."""

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

DURUN = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/release/durun")
SIZE = int(os.environ.get("SIZE", str(1 << 30)))
CHUNK = b"x" * (1 << 16)


def serve(listener):
    """Answers every request on `listener` with SIZE bytes, as its path says."""
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=answer, args=(conn,), daemon=True).start()


def answer(conn):
    with conn:
        head = b""
        while b"\r\n\r\n" not in head:
            data = conn.recv(4096)
            if not data:
                return
            head += data
        path = head.split()[1].decode()
        try:
            if path == "/plain":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                             + f"Content-Length: {SIZE}\r\nConnection: close\r\n\r\n".encode())
                for _ in range(SIZE // len(CHUNK)):
                    conn.sendall(CHUNK)
            else:
                kind = "text/event-stream" if path == "/stream" else "application/octet-stream"
                conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\n".encode()
                             + b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
                piece = (b"data: " + CHUNK[:-8] + b"\n\n") if path == "/stream" else CHUNK
                frame = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
                for _ in range(SIZE // len(piece)):
                    conn.sendall(frame)
                conn.sendall(b"0\r\n\r\n")
        except OSError:
            pass


READER = r"""
import os, sys, urllib.request
total = 0
with urllib.request.urlopen(os.environ["BIG_URL"] + sys.argv[1], timeout=600) as reply:
    while True:
        data = reply.read(1 << 20)
        if not data:
            break
        total += len(data)
status = open(f"/proc/{os.environ['DURUN_PID']}/status").read()
peak = next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1]
print(total, peak)
"""

SERVER = r"""
import sys
sys.stdin.readline()
size = int(sys.argv[1])
sys.stdout.write('{"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": "')
chunk = "x" * (1 << 16)
for _ in range(size // len(chunk)):
    sys.stdout.write(chunk)
sys.stdout.write('"}]}}\n')
sys.stdout.flush()
sys.stdin.readline()
"""


def proxy_case(work, port, path):
    with open(os.path.join(work, "durun.toml"), "w") as config:
        config.write(f'[proxy.routes.big]\nenv = "BIG_URL"\nupstream = "http://127.0.0.1:{port}"\n')
    with open(os.path.join(work, "reader.py"), "w") as reader:
        reader.write(READER)
    started = time.monotonic()
    done = subprocess.run([DURUN, "-q", "run", "--", sys.executable, "reader.py", path], cwd=work,
                          env={**os.environ, "DURUN_JOURNAL": os.path.join(work, "journal.db")},
                          capture_output=True, text=True, check=False)
    took = time.monotonic() - started
    total, peak = done.stdout.split()[-2:]
    return int(total), int(peak) / 1024, took


def mcp_case(work):
    with open(os.path.join(work, "server.py"), "w") as server:
        server.write(SERVER)
    relay = subprocess.Popen([DURUN, "mcp", "--", sys.executable, "server.py", str(SIZE)], cwd=work,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    started = time.monotonic()
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "big", "arguments": {}}}
    relay.stdin.write((json.dumps(call) + "\n").encode())
    relay.stdin.flush()
    said = json.loads(relay.stdout.readline())
    took = time.monotonic() - started
    status = open(f"/proc/{relay.pid}/status").read()
    peak = int(next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1])
    relay.stdin.close()
    relay.wait()
    return said.get("error", {}).get("message", "passed"), peak / 1024, took


def main():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    threading.Thread(target=serve, args=(listener,), daemon=True).start()
    port = listener.getsockname()[1]
    print(f"{SIZE >> 20} MiB answers through {DURUN}")
    print(f"{'case':<28} {'bytes to the agent':>20} {'durun peak RSS':>16} {'took':>8}")
    for name, path in [("proxy, plain", "/plain"), ("proxy, chunked", "/chunked"), ("proxy, event stream", "/stream")]:
        with tempfile.TemporaryDirectory() as work:
            total, peak, took = proxy_case(work, port, path)
        print(f"{name:<28} {total:>20} {peak:>13.1f} MB {took:>7.1f}s")
    with tempfile.TemporaryDirectory() as work:
        said, peak, took = mcp_case(work)
    print(f"{'durun mcp, one message':<28} {'refused':>20} {peak:>13.1f} MB {took:>7.1f}s")
    print(f"  durun mcp said: {said[:100]}")


if __name__ == "__main__":
    main()
