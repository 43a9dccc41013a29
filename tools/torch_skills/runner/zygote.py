"""The warm worker: imports torch once, then forks one fresh child per tool call.

Run by `WorkerPool` as `python -m torch_skills.runner.zygote [--preload MODULE ...]`. A preloaded
module may define `warm_up()`: it is called once after the import, before any fork, to run the
tool's code paths on tiny tensors (keep them below torch's parallel grain size, so no OpenMP
threads exist at fork time). It speaks the
JSON-lines protocol of `torch_skills.runner.protocol` on its stdin and on the stdout it was started
with. Nothing else may write there, so fd 1 is pointed at stderr right away and the protocol uses
a private duplicate.

Each child gets a new session (so its whole process group can be killed), a pipe for its
stdout+stderr that this loop drains into a bounded buffer, and a memory watchdog: this loop
kills a child whose resident plus shared memory (memfd, /dev/shm: `proctree.tree_memory_bytes`)
passes its limit (the child also gets RLIMIT_AS on CPU, and RLIMIT_FSIZE bounds each file it writes).
This process and every job child are child subreapers: a job's descendant that starts a new
session still belongs to the job's tree and dies with it (`torch_skills.runner.proctree`).
The loop is single-threaded (select), which keeps fork safe. Calls that use CUDA do not fork: they
start a fresh interpreter (`torch_skills.runner.spawned`), since a forked child cannot use a driver
that anything in this process set up.

It runs niced (WORKER_NICE) and reports ready once torch and the first preload are imported; the
other preloads are imported while no call is running.

Known limitations: the watchdog samples every 0.2 s, so a very fast allocation burst can
overshoot the limit briefly before the kill on CUDA jobs (CPU jobs are capped by RLIMIT_AS). The
niceness is inherited by the children that run user code and cannot be undone without privileges:
on a busy machine tool runs get a smaller share of the CPU than the user's other processes.
"""

from __future__ import annotations

import errno
import os
import platform
import select
import signal
import sys
import time
from dataclasses import dataclass, field

from torch_skills.runner import interpreter, libraries, proctree, protocol, spawned

_PAGE = os.sysconf("SC_PAGE_SIZE")
START_ENV = "TORCH_SKILLS_WORKER_START"  # spawn | fork | auto (default: CUDA calls spawn, the rest fork)


@dataclass
class _Job:
    job_id: str
    pid: int
    fd: int | None
    memory_limit_bytes: int
    output: protocol.OutputBuffer = field(default_factory=protocol.OutputBuffer)
    killed_for: str | None = None
    peak_rss_bytes: int = 0


class Zygote:
    def __init__(self, out_fd: int, pending_preloads: list[str] | None = None):
        self.out_fd = out_fd
        self.pending_preloads = list(pending_preloads or ())  # imported while no call is running
        self._gpu_present: bool | None = None  # asked on the first 'auto' call (device_for), not at start
        self.jobs: dict[str, _Job] = {}
        self.by_pid: dict[int, _Job] = {}
        self._stdin_buf = b""
        self._last_watch = 0.0
        self.to_preload: list[str] = []  # libraries the children imported, imported here when idle

    def send(self, message: dict) -> None:
        data = protocol.encode(message)
        while data:
            written = os.write(self.out_fd, data)
            data = data[written:]

    # -- requests -------------------------------------------------------------------------------
    def handle(self, message: dict) -> None:
        op = message.get("op")
        if op == "run":
            self.start(message)
        elif op == "preload":
            self.to_preload += [str(m) for m in message.get("modules", [])][: libraries.MAX_MODULES]
        elif op == "kill":
            job = self.jobs.get(message.get("job", ""))
            if job is not None:
                job.killed_for = job.killed_for or "request"
                self._kill_group(job.pid)

    def start(self, message: dict) -> None:
        from torch_skills.runner import child

        message = dict(message, device=self.device_for(str(message.get("device", "auto"))))
        read_fd, write_fd = os.pipe()
        if self.fresh_interpreter_for(message["device"]):
            os.set_inheritable(write_fd, True)
            argv = spawned.command(message, write_fd)
            pid = os.posix_spawn(argv[0], argv, dict(os.environ))
        else:
            pid = os.fork()
            if pid == 0:  # child: never returns
                os.close(read_fd)
                child.run_child(message, write_fd, self.out_fd)
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        job = _Job(message["job"], pid, read_fd, int(message.get("memory_limit_bytes", 0)))
        self.jobs[job.job_id] = job
        self.by_pid[pid] = job
        self.send({"event": "started", "job": job.job_id, "pid": pid})

    def device_for(self, requested: str) -> str:
        """'cuda' or 'cpu' for a call that asked for 'auto', 'cpu' or 'cuda' ('auto' is asked once,
        through NVML: PYTORCH_NVML_BASED_CUDA_CHECK; a worker without torch runs on the CPU)."""
        if requested in ("cpu", "cuda"):
            return requested
        if self._gpu_present is None:
            torch = sys.modules.get("torch")
            self._gpu_present = bool(torch is not None and torch.cuda.is_available())
        return "cuda" if self._gpu_present else "cpu"

    @staticmethod
    def fresh_interpreter_for(device: str) -> bool:
        """Whether a call on `device` runs in a fresh interpreter (CUDA) rather than a fork of this
        process (a driver anything here set up is unusable in a forked child).
        TORCH_SKILLS_WORKER_START=spawn or =fork overrides the choice for every call."""
        forced = os.environ.get(START_ENV, "auto")
        return forced == "spawn" if forced in ("spawn", "fork") else device == "cuda"

    # -- children -------------------------------------------------------------------------------
    def _kill_group(self, pid: int) -> None:
        """Kill the job's process and every descendant: its group, and processes in new sessions."""
        for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: proctree.kill_tree(pid)):
            try:
                target()
            except OSError:
                pass

    def _kill_orphans(self) -> None:
        """Kill what reparented to this subreaper from jobs that are gone (e.g. setsid grandchildren)."""
        proctree.kill_orphans(os.getpid(), keep=set(self.by_pid))

    def drain(self, job: _Job) -> None:
        if job.fd is None:
            return
        while True:
            try:
                data = os.read(job.fd, 65536)
            except OSError as e:
                if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    return
                data = b""
            if not data:
                os.close(job.fd)
                job.fd = None
                return
            job.output.feed(data)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            job = self.by_pid.pop(pid, None)
            if job is None:
                continue  # an orphan of a finished job, reparented here and now gone
            self._kill_group(pid)  # leftovers such as DataLoader workers
            self._kill_orphans()  # ...and what left the group (start_new_session) before the job died
            self.drain(job)
            if job.fd is not None:  # a grandchild still holds the pipe open
                os.close(job.fd)
                job.fd = None
            del self.jobs[job.job_id]
            self.send(
                {
                    "event": "exited",
                    "job": job.job_id,
                    "returncode": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
                    "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                    "killed_for": job.killed_for,
                    "peak_rss_bytes": job.peak_rss_bytes,
                    "output": job.output.text(),
                    "output_bytes": job.output.total,
                    "output_truncated": job.output.truncated,
                }
            )

    def watch_memory(self) -> None:
        now = time.monotonic()
        if now - self._last_watch < 0.2:
            return
        self._last_watch = now
        for job in list(self.jobs.values()):
            rss = proctree.tree_memory_bytes(job.pid)  # shared memory (memfd, /dev/shm) included
            job.peak_rss_bytes = max(job.peak_rss_bytes, rss)
            if job.memory_limit_bytes and rss > job.memory_limit_bytes and job.killed_for is None:
                job.killed_for = "memory"
                self._kill_group(job.pid)

    def shutdown(self) -> None:
        for job in list(self.jobs.values()):
            self._kill_group(job.pid)
        proctree.kill_orphans(os.getpid(), keep=set())
        sys.exit(0)

    # -- loop -----------------------------------------------------------------------------------
    def serve(self) -> None:
        while True:
            fds = [0] + [job.fd for job in self.jobs.values() if job.fd is not None]
            try:
                readable, _, _ = select.select(fds, [], [], 0.1)
            except InterruptedError:
                readable = []
            if not readable and not self.jobs and not self._stdin_buf and self.pending_preloads:
                _preload(self.pending_preloads.pop(0))
            for fd in readable:
                if fd == 0:
                    data = os.read(0, 65536)
                    if not data:
                        self.shutdown()
                    self._stdin_buf += data
                    while b"\n" in self._stdin_buf:
                        line, self._stdin_buf = self._stdin_buf.split(b"\n", 1)
                        if line.strip():
                            self.handle(protocol.decode(line))
                else:
                    for job in list(self.jobs.values()):
                        if job.fd == fd:
                            self.drain(job)
            self.reap()
            self.watch_memory()
            if self.to_preload and not self.jobs:
                self.preload_libraries()

    def preload_libraries(self) -> None:
        """Import what the last children imported, so the next ones start with it; exit if fork got unsafe."""
        names, self.to_preload = self.to_preload, []
        problem = libraries.import_all(names)
        if problem is not None:  # a thread now runs here: forking is unsafe, so start over without it
            self.send({"event": "preload_unsafe", "library": names[0].split(".")[0], "reason": problem})
            self.shutdown()


# The oldest torch the tools work with (FakeTensorMode, FlopCounterMode, torch.amp); as pyproject.
MIN_TORCH = (2, 4)


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+")[0].split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def environment_problem() -> str | None:
    """Why this interpreter cannot run the tools (no torch, an old torch, no pydantic 2), or None.

    The message names the interpreter and the command that fixes it, since the interpreter is the
    user's (chosen with --python or found in their project), not necessarily the server's."""
    exe = sys.executable
    where = f"the worker's interpreter {exe} (Python {platform.python_version()})"
    fix_other = "or start the server with --python pointing at the interpreter your project uses"
    try:
        import torch
    except ImportError as e:
        return (
            f"{where} cannot import torch ({e}). Install it there (`{exe} -m pip install torch`, "
            f"see pytorch.org for the CUDA build), {fix_other}."
        )
    version = str(getattr(torch, "__version__", "0"))
    if _version_tuple(version) < MIN_TORCH:
        need = ".".join(map(str, MIN_TORCH))
        return (
            f"{where} has torch {version}; the tools need torch>={need}. Upgrade it there "
            f"(`{exe} -m pip install 'torch>={need}'`), {fix_other}."
        )
    try:
        import pydantic
    except ImportError as e:
        return (
            f"{where} cannot import pydantic ({e}), which the tools' worker needs for its results. "
            f"Install it there (`{exe} -m pip install 'pydantic>=2'`), {fix_other}."
        )
    if _version_tuple(str(getattr(pydantic, "VERSION", "0"))) < (2,):
        return (
            f"{where} has pydantic {pydantic.VERSION}; the tools' worker needs pydantic>=2. Upgrade it there "
            f"(`{exe} -m pip install 'pydantic>=2'`), {fix_other}."
        )
    return None


def _torch_missing() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is None


def _die_with_parent() -> None:
    """Ask Linux to kill this process when the server that started it dies."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


# Niceness of the warm worker and so of every child it forks: the server starts this process at
# once, and its `import torch` must not slow the server's handshake and tools/list on a busy
# machine (bench/startup.py). On an idle machine niceness changes nothing; under load the tool
# runs yield to the user's other work (and profile_model reports the contention).
WORKER_NICE = 10


def _lower_priority() -> None:
    try:
        os.nice(WORKER_NICE)
    except OSError:
        pass


def _preload(module: str) -> None:
    """Import a tool module and run its `warm_up()`; a broken module must not take the others down."""
    try:
        __import__(module)
        warm_up = getattr(sys.modules[module], "warm_up", None)
        if callable(warm_up):
            warm_up()  # first-use costs paid once here instead of in every forked child
    except Exception as e:
        print(f"torch-skills worker: could not preload {module}: {e!r}", file=sys.stderr)


def _set_import_path() -> None:
    """Drop the folder `python -m` put first (the working directory: the user's code is imported by
    `torch_skills.runner.codeimport`, never by accident) and append the server's copies of the
    worker's dependencies (`interpreter.WORKER_PATH_ENV`): a copy the user's environment has wins."""
    if sys.path and os.path.realpath(sys.path[0] or ".") == os.path.realpath(os.getcwd()):
        del sys.path[0]
    extra = [p for p in os.environ.pop(interpreter.WORKER_PATH_ENV, "").split(os.pathsep) if p]
    sys.path.extend(p for p in extra if p not in sys.path)


# What a worker without torch may run (`--without-torch`): torch-free code paths only.
TORCHLESS_FUNCTIONS = frozenset({"torch_skills.checkpoint.static_only:run"})


class _TorchlessZygote(Zygote):
    """Serves only TORCHLESS_FUNCTIONS; anything else is refused without forking."""

    def start(self, message: dict) -> None:
        if message.get("fn") in TORCHLESS_FUNCTIONS:
            super().start(message)
            return
        self.send({"event": "exited", "job": message.get("job"), "refused_without_torch": True})


def _serve_without_torch(out_fd: int) -> None:
    """The worker of a server installed without torch: static checks only (see TORCHLESS_FUNCTIONS)."""
    zygote = _TorchlessZygote(out_fd)
    zygote.send(
        {
            "event": "ready",
            "pid": os.getpid(),
            "torch": "",
            "python": sys.executable,
            "python_version": platform.python_version(),
        }
    )
    zygote.serve()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    _set_import_path()
    out_fd = os.dup(1)  # the protocol channel
    os.dup2(2, 1)  # anything printed from here on goes to stderr
    sys.stdout = sys.stderr
    _die_with_parent()
    _lower_priority()
    proctree.become_subreaper()  # a job's escaped descendants land here when the job ends
    sys.dont_write_bytecode = True  # never leave __pycache__ in the user's project
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"  # ...nor from the processes the user's code starts
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # device_for asks NVML, not the driver

    problem = environment_problem()
    if problem is not None and "--without-torch" in argv and _torch_missing():
        _serve_without_torch(out_fd)
        return
    if problem is not None:  # the server turns this into every call's error, with the next step
        missing_torch = _torch_missing()
        os.write(
            out_fd,
            protocol.encode(
                {"event": "unusable", "message": problem, "python": sys.executable, "no_torch": missing_torch}
            ),
        )
        return
    import torch

    preload = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--preload"]
    # Only the first preload (what every call needs) comes before "ready"; the rest are imported
    # while no call is running, so a call that arrives early waits for torch, not for every tool
    # module (estimate_memory's imports alone take seconds). A child forked before its tool's
    # module is preloaded imports it itself.
    if preload:
        _preload(preload.pop(0))
    # No torch.cuda call at start: the server's handshake waits for "ready". CUDA calls never fork
    # (fresh_interpreter_for): a driver set up in this process is unusable in the children it forks.
    zygote = Zygote(out_fd, pending_preloads=preload)
    zygote.send(
        {
            "event": "ready",
            "pid": os.getpid(),
            "torch": torch.__version__,
            "python": sys.executable,
            "python_version": platform.python_version(),
        }
    )
    zygote.serve()


if __name__ == "__main__":
    main()
