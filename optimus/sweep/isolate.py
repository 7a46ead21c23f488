"""A sweep's run in a process of its own (:func:`run_isolated`): a child of a forkserver that
imported torch once, with an address-space limit (``RLIMIT_AS``) and a wall-clock time
limit after which its process group is killed. A run that is killed or crashes is a row
with status ``failed`` and the reason, so one bad model never takes the sweep down.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
import types
from contextlib import contextmanager

from optimus_lens.sweep.task import RunTask, execute, failed_row

_CTX_LOCK = threading.Lock()
_MAIN_LOCK = threading.Lock()
_CTX: mp.context.BaseContext | None = None
_LIVE: set = set()  # child processes running now (killed on interrupt)
#: imported once by the fork server (Dynamo's and Inductor's modules cost seconds to import)
PRELOAD = [
    "torch",
    "torch._dynamo",
    "torch._inductor.fx_passes.pre_grad",
    "optimus_lens.frontend.run",
    "optimus_lens.passes",
    "optimus_lens.core.verify",
    "optimus_lens.frontend.capture",
    "optimus_lens.debug.bisect",
    "optimus_lens.debug.compare",
    "optimus_lens.perf.bench",
]


def _context():
    """The forkserver context children start from: torch, Dynamo, the engine (and
    ``transformers`` where installed) are imported once in the fork server, so a run
    starts in milliseconds, in a clean process."""
    global _CTX
    with _CTX_LOCK:
        if _CTX is None:
            import importlib.util

            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(PRELOAD + (["transformers"] if importlib.util.find_spec("transformers") else []))
            warm = ctx.Process(target=_noop, daemon=True)  # the server imports before its first fork:
            with _without_main():
                warm.start()  # wait for that here, not on a run's clock
            warm.join()
            _CTX = ctx
        return _CTX


def _noop() -> None:
    pass


@contextmanager
def _without_main():
    """Start children without re-running the caller's ``__main__``: multiprocessing's
    spawn preparation re-imports it in each child from its ``__file__``, and a runner whose
    ``__main__`` is a script that cannot be re-run (Streamlit's script runner, AppTest's
    temporary script, a notebook) would kill every child before it reports. The child's
    target lives in this module, so it needs nothing from ``__main__``."""
    with _MAIN_LOCK:
        saved = sys.modules.get("__main__")
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            if saved is not None:
                sys.modules["__main__"] = saved


def _child(task: RunTask, conn) -> None:
    os.setsid()  # its own process group: a time-out kills the report subprocess too
    lim = task.options.memory_limit_bytes
    if lim:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (lim if hard == resource.RLIM_INFINITY else min(lim, hard), hard))
    conn.send(execute(task))
    conn.close()


def _kill_group(p) -> None:
    for kill in (lambda: os.killpg(p.pid, signal.SIGKILL), p.kill):
        try:
            kill()
        except (ProcessLookupError, PermissionError, OSError):
            pass


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the run's process was killed by {name}" + (
            " (by hand, or by the kernel's out-of-memory killer)" if name == "SIGKILL" else ""
        )
    return f"the run's process exited with status {code} before reporting"


def run_isolated(task: RunTask) -> dict:
    """Run ``task`` in a child process (address-space limit ``memory_limit_bytes``, killed
    with its process group after ``time_limit_s``) and return its row; a child that dies
    or is killed gives a ``failed`` row with the reason. Never raises for the run's sake."""
    ctx = _context()
    recv, send = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(task, send), name=f"optimus sweep {task.key}", daemon=True)
    t0 = time.monotonic()
    with _without_main():
        p.start()
    send.close()
    _LIVE.add(p)
    row, timed_out = None, False
    try:
        deadline = t0 + task.options.time_limit_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready = mp.connection.wait([recv, p.sentinel], timeout=left)
            if recv in ready or (p.sentinel in ready and recv.poll()):
                try:
                    row = recv.recv()
                except EOFError:
                    pass
                break
            if p.sentinel in ready:
                break
        if row is not None:
            p.join(10)
    finally:
        if p.is_alive() or row is None:
            _kill_group(p)
        p.join(10)
        _LIVE.discard(p)
        recv.close()
    if row is not None:
        return row
    wall = time.monotonic() - t0
    if timed_out:
        return failed_row(
            task, f"time limit of {task.options.time_limit_s:g} s reached; the run's process was killed", wall
        )
    return failed_row(task, _exit_reason(p.exitcode), wall)


def kill_live_runs() -> None:
    """Kill every run process this process started and that still runs (on interrupt)."""
    for p in list(_LIVE):
        _kill_group(p)
