"""An agent whose MCP client calls a tool as an MCP task (the official `mcp`
Python SDK's `call_tool_as_task`) through `durun mcp`, and survives, in
turn, three breaks, each time fetching the result with `tasks/result`:

1. the client is killed once it has its task; a new client (through a new
   `durun mcp`) fetches the result;
2. `durun mcp` itself is killed (its server with it) while the tool holds;
   a new client fetches the result;
3. over streamable HTTP, the connection between `durun mcp` and the server
   is cut while the tool holds; the same client fetches the result. The
   first request of the probe `issue_by_key` (if durun sends one) has its
   connection broken too, before it reaches the server.

The server (mcp_task_server.py) applies each key's effect once, across
restarts, and counts them in DIR/applied.jsonl. Prints one JSON line:
what each client fetched.

    mcp_tasks_agent.py DIR            (the agent; DURUN_BIN is durun)
    mcp_tasks_agent.py DIR native     (one task through durun mcp to a server
                                      with tasks of its own)
    mcp_tasks_agent.py DIR resumed    (starts a task and waits to be killed
                                      with its run; resumed, fetches it)
    mcp_tasks_agent.py client MODE STATE COMMAND_JSON [TITLE]"""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "mcp_task_server.py")


def client(mode, state, command, title=None):
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.types import CallToolResult

    command = json.loads(command)

    async def main():
        params = StdioServerParameters(command=command[0], args=command[1:])
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                if mode == "cancel":
                    created = await session.experimental.call_tool_as_task("create_issue", {"title": title})
                    task = created.task.taskId
                    cancelled = await session.experimental.cancel_task(task)
                    shown = await session.experimental.get_task(task)
                    try:
                        await session.experimental.get_task_result(task, CallToolResult)
                        error = None
                    except Exception as err:
                        error = str(err)
                    try:
                        await session.experimental.cancel_task(task)
                        again = None
                    except Exception as err:
                        again = str(err)
                    print(json.dumps({"task": task, "cancelled": cancelled.status, "status": shown.status,
                                      "result_error": error, "cancel_again": again}), flush=True)
                    return
                if mode in ("start", "start-fetch"):
                    tools = await session.list_tools()
                    support = next(tool for tool in tools.tools if tool.name == "create_issue").execution.taskSupport
                    created = await session.experimental.call_tool_as_task(
                        "create_issue", {"title": title}
                    )
                    with open(state + ".tmp", "w") as out:
                        out.write(created.task.taskId)
                    os.rename(state + ".tmp", state)
                    if mode == "start":
                        await asyncio.sleep(3600)
                else:
                    support = None
                task = open(state).read()
                first = await session.experimental.get_task(task)
                result = await session.experimental.get_task_result(task, CallToolResult)
                final = await session.experimental.get_task(task)
                listed = await session.experimental.list_tasks()
                print(json.dumps({
                    "task": task,
                    "first_status": first.status,
                    "status": final.status,
                    "text": result.content[0].text,
                    "related": (result.meta or {}).get("io.modelcontextprotocol/related-task"),
                    "listed": [listed_task.taskId for listed_task in listed.tasks],
                    "tasks_capability": init.capabilities.tasks is not None,
                    "task_support": support,
                }), flush=True)

    asyncio.run(main())


def wait_file(path, timeout=60):
    deadline = time.time() + timeout
    while not os.path.exists(path):
        if time.time() > deadline:
            sys.exit(f"mcp_tasks_agent: {path} never came")
        time.sleep(0.02)


def start_client(*args):
    return subprocess.Popen([sys.executable, __file__, "client", *args], stdout=subprocess.PIPE, text=True)


def fetched(process):
    out, _ = process.communicate(timeout=120)
    if process.returncode != 0:
        sys.exit(f"mcp_tasks_agent: a client exited {process.returncode}")
    return json.loads(out)


def durun_mcp(*server, pid_file=None):
    command = [os.environ["DURUN_BIN"], "mcp", "--name", "tracker", "--", sys.executable, SERVER, *server]
    if pid_file:
        # The shell's pid is `durun mcp`'s once it execs.
        return ["sh", "-c", 'echo $$ > "$0"; exec "$@"', pid_file, *command]
    return command


class CutProxy:
    """A TCP relay to the server whose connections can all be cut at once,
    and which breaks the connection of the first probe request it sees."""

    def __init__(self, upstream):
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.open = []
        self.probe_dropped = False
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            down, _ = self.listener.accept()
            up = socket.create_connection(("127.0.0.1", self.upstream))
            with self.lock:
                self.open += [down, up]
            threading.Thread(target=pipe, args=(down, up, self.first_probe), daemon=True).start()
            threading.Thread(target=pipe, args=(up, down), daemon=True).start()

    def first_probe(self, data):
        """Whether `data` is (part of) the first probe request."""
        with self.lock:
            if self.probe_dropped or b'"issue_by_key"' not in data:
                return False
            self.probe_dropped = True
            return True

    def cut(self):
        with self.lock:
            for connection in self.open:
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                connection.close()
            self.open = []


def pipe(source, sink, dropped=lambda data: False):
    try:
        while data := source.recv(65536):
            if dropped(data):
                for connection in (source, sink):
                    connection.shutdown(socket.SHUT_RDWR)
                return
            sink.sendall(data)
    except OSError:
        pass
    try:
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def agent(dir):
    applied = os.path.join(dir, "applied.jsonl")
    path = lambda name: os.path.join(dir, name)

    # 1. The client is killed; the call runs on to its end in its durun mcp.
    first = start_client("start", path("task1"), json.dumps(durun_mcp("stdio", applied, path("hold1"))), "one")
    wait_file(path("task1"))
    wait_file(path("hold1.reached"))
    first.kill()
    first.wait()
    open(path("hold1"), "w").close()
    one = fetched(start_client("fetch", path("task1"), json.dumps(durun_mcp("stdio", applied))))

    # 2. durun mcp is killed, and its server with it, after the effect.
    second = start_client(
        "start", path("task2"),
        json.dumps(durun_mcp("stdio", applied, path("hold2"), pid_file=path("mcp2.pid"))), "two",
    )
    wait_file(path("task2"))
    wait_file(path("hold2.reached"))
    os.kill(int(open(path("mcp2.pid")).read()), signal.SIGKILL)
    second.kill()
    second.wait()
    open(path("hold2"), "w").close()
    two = fetched(start_client("fetch", path("task2"), json.dumps(durun_mcp("stdio", applied))))

    # 3. The connection between durun mcp and the server is cut.
    server = subprocess.Popen([sys.executable, SERVER, "http", path("port"), applied, path("hold3")])
    wait_file(path("port"))
    proxy = CutProxy(int(open(path("port")).read()))
    url = f"http://127.0.0.1:{proxy.port}/mcp"
    third = start_client(
        "start-fetch", path("task3"),
        json.dumps([os.environ["DURUN_BIN"], "mcp", "--name", "tracker", "--url", url]), "three",
    )
    wait_file(path("hold3.reached"))
    proxy.cut()
    open(path("hold3"), "w").close()
    three = fetched(third)
    server.terminate()
    server.wait()
    print(json.dumps({"one": one, "two": two, "three": three}), flush=True)


def resumed(dir):
    """A task whose whole run is killed: the resumed agent's client fetches
    it with the id it kept, through a new durun mcp in a new run."""
    applied = os.path.join(dir, "applied.jsonl")
    state = os.path.join(dir, "task")
    if os.path.exists(state):
        print(json.dumps(fetched(start_client("fetch", state, json.dumps(durun_mcp("stdio", applied))))), flush=True)
        return
    hold = [os.path.join(dir, "hold")] + (["before"] if os.environ.get("HOLD_BEFORE") else [])
    start_client("start", state, json.dumps(durun_mcp("stdio", applied, *hold)), "kept")
    time.sleep(3600)


if __name__ == "__main__":
    if sys.argv[1] == "client":
        client(*sys.argv[2:])
    elif sys.argv[2:] == ["resumed"]:
        resumed(sys.argv[1])
    elif sys.argv[2:] == ["cancel"]:
        applied = os.path.join(sys.argv[1], "applied.jsonl")
        hold = os.path.join(sys.argv[1], "hold")
        client_process = start_client("cancel", "-", json.dumps(durun_mcp("stdio", applied, hold)), "cancelled")
        out = json.loads(client_process.stdout.readline())
        # The call was cancelled while the tool held; it ends now.
        open(hold, "w").close()
        client_process.wait(timeout=120)
        print(json.dumps(out), flush=True)
    elif sys.argv[2:] == ["native"]:
        server = [os.environ["DURUN_BIN"], "mcp", "--name", "tracker", "--",
                  sys.executable, os.path.join(HERE, "mcp_native_task_server.py"),
                  os.path.join(sys.argv[1], "calls.jsonl")]
        task = os.path.join(sys.argv[1], "task")
        print(json.dumps(fetched(start_client("start-fetch", task, json.dumps(server), "native"))), flush=True)
    else:
        agent(sys.argv[1])
