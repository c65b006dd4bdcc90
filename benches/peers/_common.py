"""Shared plumbing for the durable-execution peer benchmarks.

Every peer script (dbos_steps.py, langgraph_steps.py) does
the same three things through this module:

* a trivial step body: append one line "<pid> <i>" to a side-effect counter
  file (O_APPEND, unbuffered, so it survives SIGKILL) and return
  {"i": i, "payload": "x" * 100};
* a crash hook: inside step --crash-at K the process SIGKILLs itself
  (--kill-mode self) or parks until the orchestrator SIGKILLs it from outside
  (--kill-mode external);
* an orchestrator for crash runs: start a child "run" phase that dies at
  step K, then a child "recover" phase on the same database, time both from
  outside, and read the counter file to count which steps ran twice.

Steps are numbered 1..N. Crash settings are process-level globals, never
workflow inputs, so a recovered workflow (which replays its recorded inputs)
does not crash again.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional

PAYLOAD = "x" * 100

# Process-level crash configuration, set by the "run" phase only.
CRASH_AT: Optional[int] = None
KILL_MODE: str = "self"
_COUNTER_FD: Optional[int] = None
# perf_counter() of the first step body executed in this process (recovery latency probe).
FIRST_STEP_T: Optional[float] = None


def open_counter(path: str) -> None:
    global _COUNTER_FD
    _COUNTER_FD = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def step_body(i: int) -> Dict[str, Any]:
    """The user's step: one side effect (counter line), then a small dict."""
    global FIRST_STEP_T
    if FIRST_STEP_T is None:
        FIRST_STEP_T = time.perf_counter()
    assert _COUNTER_FD is not None, "open_counter() first"
    os.write(_COUNTER_FD, b"%d %d\n" % (os.getpid(), i))
    if CRASH_AT is not None and i == CRASH_AT:
        if KILL_MODE == "self":
            os.kill(os.getpid(), signal.SIGKILL)
        else:  # wait, mid-step, for the orchestrator's kill -9
            time.sleep(3600)
    return {"i": i, "payload": PAYLOAD}


def remove_db_files(db: str) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        try:
            os.remove(db + suffix)
        except FileNotFoundError:
            pass


def base_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, required=True, help="N sequential steps")
    p.add_argument("--db", required=True, help="SQLite file (deleted first: every run starts fresh)")
    p.add_argument("--crash-at", type=int, default=None,
                   help="SIGKILL inside step K (1-based), then recover in a new process")
    p.add_argument("--kill-mode", choices=("self", "external"), default="self",
                   help="self: os.kill(getpid(), 9) inside step K; external: step K parks and "
                        "the orchestrator sends SIGKILL from outside")
    p.add_argument("--kill-delay", type=float, default=0.0,
                   help="external mode: seconds to wait after step K starts before the kill")
    p.add_argument("--counter", default=None, help="side-effect counter file (default DB.counter)")
    p.add_argument("--phase", choices=("run", "recover"), default=None, help=argparse.SUPPRESS)
    return p


def ensure_db_dir(args: argparse.Namespace) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(args.db)), exist_ok=True)


def counter_path(args: argparse.Namespace) -> str:
    return args.counter or (args.db + ".counter")


def read_counter(path: str) -> List[tuple]:
    out = []
    with open(path) as f:
        for line in f:
            pid, i = line.split()
            out.append((int(pid), int(i)))
    return out


def emit(result: Dict[str, Any]) -> None:
    print(json.dumps(result, sort_keys=False), flush=True)


def child_argv(script: str, args: argparse.Namespace, extra: List[str], phase: str) -> List[str]:
    argv = [sys.executable, script, "--phase", phase, "--steps", str(args.steps),
            "--db", args.db, "--counter", counter_path(args)] + extra
    if phase == "run":
        argv += ["--crash-at", str(args.crash_at), "--kill-mode", args.kill_mode]
    return argv


def _wait_for_step(path: str, k: int, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    needle = b" %d\n" % k
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return
        try:
            with open(path, "rb") as f:
                if needle in f.read():
                    return
        except FileNotFoundError:
            pass
        time.sleep(0.002)
    raise TimeoutError(f"step {k} never started")


def orchestrate_crash(script: str, args: argparse.Namespace, extra: List[str],
                      peer: str, variant: str,
                      child_cmd: Optional[Callable[[str], List[str]]] = None) -> Dict[str, Any]:
    """Crash run + recovery run in two child processes; analyse the counter file."""
    cpath = counter_path(args)
    remove_db_files(args.db)
    if os.path.exists(cpath):
        os.remove(cpath)
    k = args.crash_at
    assert 1 <= k <= args.steps, "--crash-at must be within 1..N"

    t0 = time.perf_counter()
    child_cmd = child_cmd or (lambda phase: child_argv(script, args, extra, phase))
    proc = subprocess.Popen(child_cmd("run"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if args.kill_mode == "external":
        _wait_for_step(cpath, k, proc)
        time.sleep(args.kill_delay)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
    _, err1 = proc.communicate()
    crash_wall = time.perf_counter() - t0
    if proc.returncode != -signal.SIGKILL:
        raise RuntimeError(f"crash phase exited {proc.returncode}, expected -9:\n{err1.decode()[-2000:]}")
    before = read_counter(cpath)
    crash_pid = proc.pid

    t1 = time.perf_counter()
    rec = subprocess.run(child_cmd("recover"), capture_output=True)
    recover_proc_wall = time.perf_counter() - t1
    if rec.returncode != 0:
        raise RuntimeError(f"recover phase exited {rec.returncode}:\n{rec.stderr.decode()[-3000:]}")
    inner = json.loads(rec.stdout.decode().strip().splitlines()[-1])

    after = read_counter(cpath)
    ran_before = [i for pid, i in before if pid == crash_pid]
    ran_after = [i for pid, i in after if pid != crash_pid]
    set_before = set(ran_before)
    completed_before = set_before - {k}  # step k was in flight when killed
    rerun = sorted(set(ran_after) & set_before)
    rerun_completed = sorted(set(ran_after) & completed_before)
    all_ran = set_before | set(ran_after)
    missing = sorted(set(range(1, args.steps + 1)) - all_ran)
    return {
        "peer": peer, "variant": variant, "mode": "crash", "steps": args.steps,
        "crash_at": k, "kill_mode": args.kill_mode
        + (f"+{args.kill_delay:g}s" if args.kill_mode == "external" and args.kill_delay else ""),
        "executed_before_crash": len(ran_before),
        "executed_in_recovery": len(ran_after),
        "reexecuted": len(rerun),
        "reexecuted_completed": len(rerun_completed),
        "reexecuted_steps": rerun[:20],
        "missing_steps": missing[:20],
        "total_executions": len(after),
        "ok": (not missing) and not rerun_completed and inner.get("ok", False),
        "crash_phase_wall_s": round(crash_wall, 4),
        "recover_proc_wall_s": round(recover_proc_wall, 4),
        **{f"recover_{k2}": v for k2, v in inner.items()
           if k2 not in ("peer", "variant", "mode", "steps", "phase")},
    }


def main(script: str, args: argparse.Namespace, extra: List[str], peer: str, variant: str,
         run_fn: Callable[[argparse.Namespace], Dict[str, Any]],
         recover_fn: Callable[[argparse.Namespace], Dict[str, Any]],
         child_cmd: Optional[Callable[[str], List[str]]] = None) -> None:
    """Dispatch: orchestrator (crash), child phases, or a plain first run."""
    global CRASH_AT, KILL_MODE
    ensure_db_dir(args)
    if args.phase is None and args.crash_at is not None:
        emit(orchestrate_crash(script, args, extra, peer, variant, child_cmd))
        return
    if args.phase is not None:  # child of orchestrate_crash: keep the counter file
        open_counter(counter_path(args))
    if args.phase == "run":  # crash child
        CRASH_AT, KILL_MODE = args.crash_at, args.kill_mode
        run_fn(args)
        raise SystemExit("crash phase finished without being killed")
    if args.phase == "recover":
        res = recover_fn(args)
        if FIRST_STEP_T is not None and "t0" in res:
            res["first_step_s"] = round(FIRST_STEP_T - res["t0"], 4)
        res.pop("t0", None)
        emit(res)
        return
    # plain first run on a fresh database
    remove_db_files(args.db)
    cpath = counter_path(args)
    with open(cpath, "w"):
        pass
    open_counter(cpath)
    res = run_fn(args)
    n_exec = len(read_counter(cpath))
    res.pop("t0", None)
    out = {"peer": peer, "variant": variant, "mode": "first_run", "steps": args.steps, **res,
           "executions": n_exec}
    out["ok"] = bool(out.get("ok", True)) and n_exec == args.steps
    emit(out)
