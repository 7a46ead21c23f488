"""Where a sweep's runs go: a local thread pool of ``workers`` slots, each run in its own
process (:func:`run_local`), or Ray tasks that each call
:func:`optimus_lens.sweep.isolate.run_isolated` on their worker (:func:`run_ray`; Ray places
them, nothing here schedules across machines). Either way each row is handed to
``on_row`` in the driver's thread as its run finishes.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from importlib import resources
from pathlib import Path

from optimus_lens.sweep.configs import SweepError
from optimus_lens.sweep.isolate import kill_live_runs, run_isolated
from optimus_lens.sweep.task import RunTask, failed_row


def run_local(tasks: list[RunTask], workers: int, on_row: Callable[[dict], None]) -> None:
    """Run ``tasks`` ``workers`` at a time, each in its own process (:func:`run_isolated`),
    calling ``on_row`` in this thread as each finishes. On KeyboardInterrupt every live
    run is killed and the interrupt re-raised (finished rows are already reported)."""
    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="optimus-sweep")
    futures = {pool.submit(run_isolated, t): t for t in tasks}
    try:
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                on_row(f.result())
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        kill_live_runs()
        raise
    pool.shutdown()


def ray_runtime_env(wheel: str | None = None) -> dict:
    """The Ray runtime environment that brings this package to the workers
    (``py_modules``: folders Ray zips, uploads and puts on the workers' path): the
    package folders of a built Optimus Lens wheel when ``wheel`` is given (unpacked here;
    Ray's own ``.whl`` support would ``pip install`` the wheel's dependencies, torch
    included, on every node), else this installation's ``optimus_lens`` package
    folder. Either way the workers need the dependencies (torch, and
    transformers for ``hf:`` models) installed. Raises SweepError for a wheel that is not
    a readable zip with a package in it."""
    if wheel:
        return {"py_modules": _wheel_packages(wheel)}
    return {"py_modules": [str(resources.files("optimus_lens"))]}


def _wheel_packages(wheel: str) -> list[str]:
    import tempfile
    import zipfile

    dest = Path(tempfile.mkdtemp(prefix="optimus-wheel-"))
    try:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(dest)
    except (OSError, zipfile.BadZipFile) as e:
        raise SweepError(f"cannot unpack wheel {wheel}: {e}") from e
    pkgs = [
        str(p)
        for p in sorted(dest.iterdir())
        if p.is_dir() and not p.name.endswith((".dist-info", ".data")) and (p / "__init__.py").is_file()
    ]
    if not pkgs:
        raise SweepError(f"wheel {wheel} holds no Python package")
    return pkgs


def run_ray(
    tasks: list[RunTask], address: str, on_row: Callable[[dict], None], workers: int = 1, wheel: str | None = None
) -> None:
    """Submit ``tasks`` as Ray tasks (one CPU each) that call :func:`run_isolated` on their
    worker, calling ``on_row`` with each row as it finishes (``ray.wait``). ``address`` is
    ``"local"`` (start a Ray instance on this machine with ``workers`` CPUs) or a cluster
    address (``"auto"``, ``"ray://host:10001"``). The package travels in the runtime
    environment (:func:`ray_runtime_env`). A task whose worker dies is a ``failed`` row.
    Raises ImportError (with the install command) when Ray is missing."""
    try:
        import ray
    except ImportError as e:
        raise ImportError("--ray needs Ray: pip install 'optimus-lens[sweep]'") from e
    env = ray_runtime_env(wheel)
    if address == "local":
        ray.init(
            address="local", num_cpus=max(1, workers), include_dashboard=False, log_to_driver=False, runtime_env=env
        )
    else:
        ray.init(address=address, log_to_driver=False, runtime_env=env)
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(run_isolated)
        refs = {remote.remote(t): t for t in tasks}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    row = ray.get(ref)
                except Exception as e:  # noqa: BLE001 - a lost worker loses only its run
                    row = failed_row(refs[ref], f"the Ray task failed: {type(e).__name__}: {str(e)[:2000]}")
                on_row(row)
    except BaseException:
        for ref in refs:
            ray.cancel(ref, force=True)
        raise
    finally:
        ray.shutdown()
