"""Run one ``mpiexec`` job from a serial test, with a hard time limit.

Every serial test that launches a job goes through :func:`run_job`, because
ending a hung job is not as simple as killing ``mpiexec``: MPICH's Hydra
starts each proxy and each rank in a session of its own, so killing
mpiexec's process group (or mpiexec alone, as ``subprocess.run(timeout=)``
does) leaves the ranks running, orphaned, loading the machine for every test
after this one. Here the job's process tree is collected first, reported
(state, kernel wait channel and, where gdb is installed, each thread's C
stack: a hang seen once in CI then says where every rank waited) and only
then killed, every process of it.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess

# Lines of gdb's backtraces kept per process (the report must stay readable
# in a test failure's message).
STACK_LINES = 60


def _children() -> dict:
    """{parent pid: [child pids]} of every process now running."""
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    return kids


def job_tree(pid: int) -> list:
    """``pid`` and all its descendants, parents first."""
    kids, out, todo = _children(), [], [pid]
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(sorted(kids.get(p, ())))
    return out


def stuck_report(pids) -> str:
    """Where each process of a hung job is."""
    lines = ["", "--- the hung job's processes ---"]
    gdb = shutil.which("gdb")
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{pid}/wchan") as f:
                wchan = f.read().strip()
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        lines.append(f"pid {pid} state {state} wchan {wchan}: {cmd[:200]}")
        if gdb and "python" in cmd:
            try:
                bt = subprocess.run([gdb, "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt 20"],
                                    capture_output=True, text=True, timeout=30).stdout
            except (OSError, subprocess.TimeoutExpired):
                continue
            lines += [ln for ln in bt.splitlines() if ln.startswith(("#", "Thread"))][:STACK_LINES]
    return "\n".join(lines) + "\n"


def run_job(cmd, hard: float, env=None, merge: bool = False):
    """Run ``cmd``; returns (return code, or None when it was still running
    after ``hard`` seconds and was killed; stdout; stderr). With ``merge``
    stderr goes into stdout (one stream, in the order written) and the
    third value is "". A killed job's stderr ends with :func:`stuck_report`."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merge else subprocess.PIPE,
                            text=True, env=env)
    try:
        out, err = proc.communicate(timeout=hard)
        return proc.returncode, out, err or ""
    except subprocess.TimeoutExpired:
        pids = job_tree(proc.pid)
        where = stuck_report(pids)
        for pid in reversed(pids):  # the ranks first, so none is left orphaned
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out, err = proc.communicate()
        return None, out or "", (err or "") + where
