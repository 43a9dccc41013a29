"""Server side of the runner: one warm worker process, a bounded number of concurrent jobs.

Use inside an async server:

    async with WorkerPool(max_concurrent=2) as pool:
        result = await pool.run("torch_skills.gradients.worker:run", request, timeout_s=60,
                                memory_limit_bytes=8 << 30, device="auto", cwd=Path.cwd(),
                                allowed_roots=[...], on_progress=cb)

`run` returns a `JobResult` (the result JSON, run facts, the captured output) or raises
`WorkerError` for every failure: the user's exception, sys.exit, a crash, a hang, a memory
overrun, a cancelled call. No job outlives its call: on timeout or cancellation the job's whole
process group is killed. This module never imports torch; the worker does
(`torch_skills.runner.zygote`).

Known limitations: Linux only (fork, process groups, /proc).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from anyio.abc import Process, TaskGroup
from anyio.streams.buffered import BufferedByteReceiveStream

from torch_skills.runner import interpreter, protocol
from torch_skills.runner.errors import WorkerError

# The worker is started as `python -m torch_skills.runner.zygote` with a folder on PYTHONPATH that
# holds one link, `torch_skills`, to the package the server runs from (a clone's
# tools/torch_skills/ or an installed copy): nothing else of the server's environment, and no
# module of the user's that shares a name, comes with it.
WORKER_MODULE = "torch_skills.runner.zygote"
ProgressCallback = Callable[[float, float | None, str | None], Awaitable[None]]

_SIGNAL_NAMES = {int(s): s.name for s in signal.Signals}


JOB_DIR_PREFIX = "torch-skills-job-"
# The largest file a job may write (RLIMIT_FSIZE): a profile_model trace of a large model is tens
# to hundreds of MB; a runaway writer (a progress or log file in a loop) stops here with EFBIG.
FILE_SIZE_LIMIT_BYTES = 4 << 30
# Share of physical memory the jobs may hold together; the rest is the server's and the OS's.
MEMORY_BUDGET_FRACTION = 0.8


def no_torch_anywhere_message(python: str) -> str:
    """The error every torch tool gives when no interpreter with torch was found: the one fix first.

    The server's own environment has no torch by design (`pip install torch-skills` pulls none);
    the tools run the user's code under the project's interpreter, which has it."""
    return (
        f"No Python with torch to run your code: the server's own interpreter ({python}) has no torch, "
        f"and no project environment was found in {os.getcwd()} (.venv, venv, VIRTUAL_ENV, CONDA_PREFIX). "
        "Fix: restart the server with `--python /path/to/your/project/.venv/bin/python` (the environment your "
        "model code runs in; an environment folder works too), or start it in your project folder. "
        "Without a project, install torch beside the server instead: `pip install 'torch-skills[torch]'` "
        "(uvx: `uvx --from 'torch-skills[torch]' torch-skills`). route, the skills and the static checkpoint "
        "scan work without torch."
    )


def physical_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 16 << 30


def memory_budget_bytes() -> int:
    """RAM all concurrent jobs may hold together: MEMORY_BUDGET_FRACTION of the machine's memory."""
    return int(physical_memory_bytes() * MEMORY_BUDGET_FRACTION)


def default_memory_limit_bytes(max_jobs: int = 2) -> int:
    """One job's default cap: the budget shared by `max_jobs` jobs, so together they fit the machine."""
    return memory_budget_bytes() // max(1, max_jobs)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale_job_dirs(tmp: Path | None = None) -> list[Path]:
    """Remove `torch-skills-job-<pid>-*` folders whose server process is gone; return what was removed.

    A server killed mid-call cannot clean up, and its folder holds the call's arguments. Folders of
    live servers (the pid still runs) and folders not named this way are left alone."""
    tmp = Path(tmp or tempfile.gettempdir())
    removed = []
    try:
        entries = list(tmp.glob(f"{JOB_DIR_PREFIX}*"))
    except OSError:
        return removed
    for entry in entries:
        owner = entry.name[len(JOB_DIR_PREFIX) :].split("-", 1)[0]
        if not owner.isdigit() or _pid_alive(int(owner)):
            continue
        try:
            if entry.is_dir() and not entry.is_symlink() and entry.stat().st_uid == os.getuid():
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
        except OSError:
            continue
    return removed


# At most this many bytes of a job's progress file are read per poll (every 0.25 s), and at most
# this many of the newest reports in them are relayed: a job that floods its progress file costs
# the server a bounded read and a bounded number of notifications per poll.
PROGRESS_READ_BYTES = 64 * 1024
PROGRESS_LINES_PER_POLL = 8

Progress = tuple[float, float | None, str | None]


class ProgressReader:
    """Reads a job's progress file (JSON lines) from where it left off, a bounded amount per poll.

    Use: `reader = ProgressReader(path)`, then `reader.poll()` now and then: the newest complete
    reports since the last poll as `(done, total, message)`, oldest first, at most `max_lines`.
    A job that writes faster than that, or writes one endless line, costs each poll at most
    `max_bytes`: when more than that is new, the reader jumps to the last `max_bytes` (older
    reports are stale anyway) and skips the partial line it lands in."""

    def __init__(
        self, path: Path, max_bytes: int = PROGRESS_READ_BYTES, max_lines: int = PROGRESS_LINES_PER_POLL
    ):
        self.path = path
        self.max_bytes = max_bytes
        self.max_lines = max_lines
        self.offset = 0
        self._skipping = False  # inside a line whose start was jumped over: drop it up to its newline

    def poll(self) -> list[Progress]:
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size - self.offset > self.max_bytes:
                    self.offset = size - self.max_bytes
                    self._skipping = True
                f.seek(self.offset)
                chunk = f.read(self.max_bytes)
        except OSError:
            return []
        end = chunk.rfind(b"\n") + 1
        if self._skipping:
            if end == 0:  # still inside the skipped line: move on past it
                self.offset += len(chunk) if len(chunk) == self.max_bytes else 0
                return []
            start = chunk.find(b"\n") + 1
            self._skipping = False
        else:
            if end == 0 and len(chunk) == self.max_bytes:  # one line longer than a read: skip it
                self.offset += len(chunk)
                self._skipping = True
                return []
            start = 0
        self.offset += end
        found: list[Progress] = []
        for line in reversed(chunk[start:end].splitlines()):
            if len(found) == self.max_lines:
                break
            item = _progress_item(line)
            if item is not None:
                found.append(item)
        return found[::-1]


def _progress_item(line: bytes) -> Progress | None:
    try:
        item = json.loads(line)
        total, message = item.get("total"), item.get("message")
        return (
            float(item["progress"]),
            float(total) if total is not None else None,
            str(message)[:1000] if message is not None else None,
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


@dataclass
class JobResult:
    """What a successful job returned, plus how it ran."""

    result: dict[str, Any]
    wall_time_s: float
    device: str
    torch_version: str
    output: str
    output_bytes: int
    output_truncated: bool
    peak_rss_bytes: int
    python: str = ""  # the interpreter that ran the code
    cpu_threads: int | None = None  # torch intra-op threads the run used (None: torch not loaded)


@dataclass
class _Pending:
    started: anyio.Event = field(default_factory=anyio.Event)
    exited: anyio.Event = field(default_factory=anyio.Event)
    pid: int | None = None
    exit: dict[str, Any] | None = None
    process: Any = None  # the warm worker the job was sent to


class WorkerPool:
    """Runs tool functions in fresh children of one warm, torch-preloaded worker."""

    def __init__(
        self,
        *,
        max_concurrent: int = 2,
        preload: tuple[str, ...] = (),
        python: str = sys.executable,
        python_source: str = "the server's own",
        start_timeout_s: float = 120.0,
        memory_budget: int | None = None,
        without_torch: bool = False,
        file_size_limit_bytes: int = FILE_SIZE_LIMIT_BYTES,
    ):
        self.file_size_limit_bytes = file_size_limit_bytes
        self.max_concurrent = max_concurrent
        self.memory_budget = memory_budget or memory_budget_bytes()
        self.preload = preload
        self.python = python
        self.python_source = python_source  # why this interpreter (for messages)
        self.without_torch = without_torch  # a worker that runs only torch-free functions (no torch here)
        self._deps_dir: Path | None = None
        self._package_dir: Path | None = None  # holds the `torch_skills` link the worker imports
        self._preloaded: set[str] = set()  # libraries the warm worker was asked to import
        self._unsafe_libraries: set[str] = set()  # top-level names whose import left a thread running
        self.start_timeout_s = start_timeout_s
        self._queue: list[object] = []  # callers waiting for admission, first come first served
        self._running = 0
        self._reserved = 0  # memory caps of the running jobs, bytes
        self._changed = anyio.Event()  # set (and replaced) whenever a job is admitted or ends
        self._task_group: TaskGroup | None = None
        self._process: Process | None = None
        self._ready = anyio.Event()
        self._info: dict[str, Any] = {}
        self._pending: dict[str, _Pending] = {}
        self._send_lock = anyio.Lock()
        self._start_lock = anyio.Lock()
        self._startup_error: str | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    async def __aenter__(self) -> WorkerPool:
        sweep_stale_job_dirs()
        self._tg_cm = anyio.create_task_group()
        self._task_group = await self._tg_cm.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
        assert self._task_group is not None
        self._task_group.cancel_scope.cancel()
        await self._tg_cm.__aexit__(None, None, None)
        self._task_group = None

    async def close(self) -> None:
        """Stop the warm worker; its children die with it (they are killed on its stdin EOF)."""
        process, self._process = self._process, None
        folders, self._deps_dir, self._package_dir = (self._deps_dir, self._package_dir), None, None
        try:
            await self._stop(process)
        finally:  # after the worker is gone: one still preloading imports through these folders
            for folder in folders:
                if folder is not None:
                    shutil.rmtree(folder, ignore_errors=True)

    async def _stop(self, process: Process | None) -> None:
        if process is None:
            return
        with anyio.CancelScope(shield=True):
            try:
                if process.stdin is not None:
                    await process.stdin.aclose()
                with anyio.move_on_after(3):
                    await process.wait()
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()

    def prewarm(self, delay_s: float = 0.0) -> None:
        """Start the warm worker in the background so the first call does not pay for `import torch`.

        `delay_s` lets the server answer its handshake first: importing torch takes a core for
        about two seconds, which would otherwise compete with start-up. A call that arrives
        earlier starts the worker itself."""
        if self._task_group is not None and self._process is None:
            self._task_group.start_soon(self._start_after, delay_s)

    async def _start_after(self, delay_s: float) -> None:
        await anyio.sleep(delay_s)
        await self._ensure_started()

    @property
    def worker_info(self) -> dict[str, Any]:
        """torch version and CUDA availability reported by the warm worker (empty until it is ready)."""
        return dict(self._info)

    async def _ensure_started(self) -> None:
        async with self._start_lock:
            if self._process is not None and self._process.returncode is None:
                return
            if self._task_group is None:
                raise RuntimeError("WorkerPool must be used as `async with WorkerPool() as pool:`")
            self._ready = anyio.Event()
            self._startup_error = None
            self._preloaded = set()
            env = dict(os.environ)
            env["PYTHONUNBUFFERED"] = "1"
            env["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ in the user's project
            env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
            env.pop(interpreter.WORKER_PATH_ENV, None)
            if self._package_dir is None or not self._package_dir.is_dir():
                self._package_dir = interpreter.worker_package_dir()
            env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(self._package_dir), os.environ.get("PYTHONPATH")])
            )
            if not interpreter.same_environment(self.python, sys.executable):
                if self._deps_dir is None or not self._deps_dir.is_dir():
                    self._deps_dir = interpreter.worker_dependency_dir()
                env[interpreter.WORKER_PATH_ENV] = str(self._deps_dir)
            args = [self.python, "-m", WORKER_MODULE, *(["--without-torch"] if self.without_torch else [])]
            for module in self.preload:
                args += ["--preload", module]
            self._process = await anyio.open_process(
                args,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=None,
                env=env,
                start_new_session=True,
            )
            self._task_group.start_soon(self._read_events, self._process)

    async def _read_events(self, process: Process) -> None:
        assert process.stdout is not None
        stream = BufferedByteReceiveStream(process.stdout)
        try:
            while True:
                line = await stream.receive_until(b"\n", 1 << 20)
                self._dispatch(protocol.decode(line))
        except (
            anyio.EndOfStream,
            anyio.IncompleteRead,
            anyio.ClosedResourceError,
            anyio.BrokenResourceError,
        ):
            pass
        finally:
            await self._worker_gone(process)

    def _dispatch(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "ready":
            self._info = {k: event.get(k) for k in ("torch", "pid", "python", "python_version")}
            self._ready.set()
            return
        if kind == "preload_unsafe":  # the worker exits next: the next call starts a fresh one
            self._unsafe_libraries.add(str(event.get("library", "")))
            self._process = None
            return
        if kind == "unusable":
            if event.get("no_torch") and interpreter.same_environment(self.python, sys.executable):
                self._startup_error = no_torch_anywhere_message(self.python)
            else:
                self._startup_error = (
                    f"{event.get('message', 'the worker cannot run the tools')} "
                    f"(interpreter chosen: {self.python_source})"
                )
            self._ready.set()
            return
        pending = self._pending.get(event.get("job", ""))
        if pending is None:
            return
        if kind == "started":
            pending.pid = int(event["pid"])
            pending.started.set()
        elif kind == "exited":
            pending.exit = event
            pending.started.set()
            pending.exited.set()

    async def _worker_gone(self, process: Process) -> None:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                with anyio.move_on_after(2):
                    await process.wait()
        code = process.returncode
        current = self._process is process
        if current:
            self._process = None
        if current and not self._ready.is_set():
            self._startup_error = (
                f"the torch worker ({self.python}, {self.python_source}) exited while starting (exit code {code}); "
                f"check that `{self.python} -c 'import torch'` works, or start the server with --python "
                "pointing at the interpreter your project uses"
            )
            self._ready.set()
        for pending in self._pending.values():
            if pending.process is process and not pending.exited.is_set():
                pending.exit = {"worker_died": True, "returncode": code}
                pending.started.set()
                pending.exited.set()

    async def _send(self, message: dict[str, Any]) -> None:
        process = self._process
        if process is None or process.stdin is None:
            return
        async with self._send_lock:
            try:
                await process.stdin.send(protocol.encode(message))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass

    # -- jobs -----------------------------------------------------------------------------------
    async def run(
        self,
        fn: str,
        request: Any,
        *,
        timeout_s: float,
        memory_limit_bytes: int | None = None,
        device: str = "auto",
        cwd: Path | None = None,
        allowed_roots: list[Path] | None = None,
        on_progress: ProgressCallback | None = None,
        file_size_limit_bytes: int | None = None,
    ) -> JobResult:
        """Run `fn` (a 'module:function' path) on `request` in a fresh child; see the module docstring.

        Time spent waiting for a free worker (all `max_concurrent` busy, or the memory budget taken
        by running jobs) counts toward `timeout_s`, and `on_progress` hears "waiting for a free
        worker (N ahead)" meanwhile. `memory_limit_bytes` defaults to the budget's share of one of
        `max_concurrent` jobs; the caps of running jobs never add up to more than the budget.
        `file_size_limit_bytes` (default: the pool's) bounds every file the job writes."""
        payload = request.model_dump(mode="json") if hasattr(request, "model_dump") else request
        limit = int(memory_limit_bytes or default_memory_limit_bytes(self.max_concurrent))
        if limit > self.memory_budget:
            raise WorkerError(
                "bad_request",
                f"memory_limit_gib={limit / 2**30:.1f} is more than this machine can give one job "
                f"({self.memory_budget / 2**30:.1f} GiB, {MEMORY_BUDGET_FRACTION:.0%} of its RAM); call again with a "
                "smaller memory_limit_gib.",
            )
        queued_at = anyio.current_time()
        async with self._admitted(limit, timeout_s, on_progress):
            remaining = timeout_s - (anyio.current_time() - queued_at)
            with anyio.fail_after(self.start_timeout_s, shield=False):
                await self._ensure_started()
                await self._ready.wait()
            if self._startup_error:
                raise WorkerError("worker_unavailable", self._startup_error)
            job_id = uuid.uuid4().hex
            job_dir = Path(tempfile.mkdtemp(prefix=f"{JOB_DIR_PREFIX}{os.getpid()}-"))
            try:
                (job_dir / protocol.REQUEST_FILE).write_text(json.dumps(payload))
                return await self._run_job(
                    job_id,
                    job_dir,
                    {
                        "op": "run",
                        "job": job_id,
                        "dir": str(job_dir),
                        "fn": fn,
                        "cwd": str(cwd or Path.cwd()),
                        "allowed_roots": [str(r) for r in (allowed_roots or [])],
                        "memory_limit_bytes": limit,
                        "file_size_limit_bytes": int(file_size_limit_bytes or self.file_size_limit_bytes),
                        "device": device,
                    },
                    max(remaining, 0.001),
                    on_progress,
                    timeout_s,
                )
            finally:
                shutil.rmtree(job_dir, ignore_errors=True)

    def _learn_libraries(self, names: Any) -> None:
        """Ask the warm worker to import the installed libraries this call imported (runner.libraries)."""
        if not isinstance(names, list):
            return
        new = [
            str(n)
            for n in names
            if isinstance(n, str)
            and n not in self._preloaded
            and n.split(".")[0] not in self._unsafe_libraries
        ]
        if not new or self._task_group is None:
            return
        self._preloaded.update(new)
        self._task_group.start_soon(self._send, {"op": "preload", "modules": new})

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    @contextlib.asynccontextmanager
    async def _admitted(
        self, limit: int, timeout_s: float, on_progress: ProgressCallback | None
    ) -> AsyncIterator[None]:
        """Wait (first come, first served) for a free slot and `limit` bytes of the memory budget."""
        token = object()
        self._queue.append(token)
        told = None
        try:
            with anyio.move_on_after(timeout_s) as waiting:
                while not (
                    self._queue[0] is token
                    and self._running < self.max_concurrent
                    and self._reserved + limit <= self.memory_budget
                ):
                    ahead = self._running + self._queue.index(token)
                    if on_progress is not None and ahead != told:
                        told = ahead
                        await on_progress(0, None, f"waiting for a free worker ({ahead} ahead)")
                    await self._changed.wait()
            if waiting.cancelled_caught:
                raise WorkerError(
                    "timeout",
                    f"no worker became free within timeout_s={timeout_s:g} s (max_jobs={self.max_concurrent}, "
                    f"{self._running} running, {self._queue.index(token)} waiting ahead): the time spent waiting "
                    "counts toward timeout_s. Call again later or with a larger timeout_s.",
                )
        finally:
            self._queue.remove(token)
            self._notify()
        self._running += 1
        self._reserved += limit
        try:
            yield
        finally:
            self._running -= 1
            self._reserved -= limit
            self._notify()

    async def _run_job(
        self,
        job_id: str,
        job_dir: Path,
        message: dict[str, Any],
        timeout_s: float,
        on_progress: ProgressCallback | None,
        asked_timeout_s: float | None = None,
    ) -> JobResult:
        pending = self._pending[job_id] = _Pending(process=self._process)
        stopped_for: str | None = None
        try:
            await self._send(message)
            with anyio.move_on_after(timeout_s) as deadline:
                async with anyio.create_task_group() as tg:
                    if on_progress is not None:
                        tg.start_soon(self._relay_progress, job_dir, pending, on_progress)
                    await pending.exited.wait()  # the relay then reads what is left and returns
            if deadline.cancelled_caught:
                stopped_for = "timeout"
        except BaseException:
            stopped_for = "cancelled"
            raise
        finally:
            if stopped_for is not None:
                with anyio.CancelScope(shield=True):
                    await self._kill(job_id, pending)
            self._pending.pop(job_id, None)
        exit_info = pending.exit or {}
        return self._outcome(job_dir, exit_info, stopped_for, asked_timeout_s or timeout_s, message)

    async def _kill(self, job_id: str, pending: _Pending) -> None:
        await self._send({"op": "kill", "job": job_id})
        if pending.pid is not None:
            for kill in (
                lambda: os.killpg(pending.pid, signal.SIGKILL),
                lambda: os.kill(pending.pid, signal.SIGKILL),
            ):
                try:
                    kill()
                except OSError:
                    pass
        with anyio.move_on_after(5):
            await pending.exited.wait()

    async def _relay_progress(self, job_dir: Path, pending: _Pending, callback: ProgressCallback) -> None:
        reader = ProgressReader(job_dir / protocol.PROGRESS_FILE)
        finished = False
        while not finished:
            with anyio.move_on_after(0.25):
                await pending.exited.wait()
            finished = pending.exited.is_set()  # one last read after the exit: no line is lost
            for item in await anyio.to_thread.run_sync(reader.poll):  # the read never blocks the loop
                await callback(*item)

    def _outcome(
        self,
        job_dir: Path,
        exit_info: dict[str, Any],
        stopped_for: str | None,
        timeout_s: float,
        message: dict,
    ) -> JobResult:
        output = str(exit_info.get("output", ""))
        if stopped_for == "timeout":
            raise WorkerError(
                "timeout",
                f"the code ran past timeout_s={timeout_s:g} s and was stopped. If it is just slow, call again with a "
                "larger timeout_s or a smaller input; if it hangs (an endless loop, a barrier waiting for other "
                "ranks, a DataLoader worker stuck), the output below shows how far it got.",
                output,
            )
        if stopped_for == "cancelled":
            raise WorkerError("cancelled", "the call was cancelled and its process killed", output)
        if exit_info.get("refused_without_torch"):
            raise WorkerError("worker_unavailable", no_torch_anywhere_message(self.python), output)
        if exit_info.get("worker_died"):
            raise WorkerError(
                "worker_unavailable",
                "the warm torch worker died during the call (it is restarted on the next call); call again",
                output,
            )
        if exit_info.get("killed_for") == "memory":
            limit = message["memory_limit_bytes"] / 2**30
            raise WorkerError(
                "out_of_memory",
                f"the code used more than memory_limit_gib={limit:.1f} GiB of RAM (resident plus shared memory) "
                "and was stopped. Use a smaller batch "
                "or input_shape, or raise memory_limit_gib if the machine has room.",
                output,
            )
        result_path, error_path = job_dir / protocol.RESULT_FILE, job_dir / protocol.ERROR_FILE
        if result_path.exists():
            data = json.loads(result_path.read_text())
            self._learn_libraries(data.get("libraries"))
            return JobResult(
                result=data["result"],
                wall_time_s=float(data["wall_time_s"]),
                device=str(data.get("device", message["device"])),
                torch_version=str(self._info.get("torch", "")),
                output=output,
                output_bytes=int(exit_info.get("output_bytes", 0)),
                output_truncated=bool(exit_info.get("output_truncated", False)),
                peak_rss_bytes=int(exit_info.get("peak_rss_bytes", 0)),
                python=self.python,  # the interpreter chosen, as found on disk (not a resolved link)
                cpu_threads=data.get("cpu_threads") if isinstance(data.get("cpu_threads"), int) else None,
            )
        if error_path.exists():
            error = json.loads(error_path.read_text())
            self._learn_libraries(error.get("libraries"))
            raise WorkerError(error["kind"], error["message"], output)
        sig = exit_info.get("signal")
        if sig is not None:
            name = _SIGNAL_NAMES.get(int(sig), f"signal {sig}")
            hint = {
                "SIGSEGV": "a segmentation fault, usually in a C extension or a custom kernel",
                "SIGABRT": "an abort, usually a failed assertion in native code",
                "SIGKILL": "killed from outside, most often by the kernel's out-of-memory killer",
                "SIGBUS": "a bus error, often a memory-mapped file that changed underneath",
                "SIGXFSZ": "a file grew past the per-call file size limit of "
                f"{message.get('file_size_limit_bytes', 0) / 2**20:.0f} MiB",
            }.get(name, "a fatal signal")
            raise WorkerError(
                "crash",
                f"the code crashed with {name} ({hint}). The output below ends where it died.",
                output,
            )
        code = exit_info.get("returncode")
        raise WorkerError(
            "crash",
            f"the process exited with code {code} before returning a result: the code called os._exit() or the "
            "interpreter aborted. Remove the exit from the factory or the code it imports.",
            output,
        )
