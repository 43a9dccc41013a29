"""What each forked child does: isolate itself, set torch's threads, run one tool function, write its result.

`run_child` is called by the zygote right after fork and never returns. Tool functions have the
form `def run(request: SomeRequest, job: JobContext) -> SomeResult` (pydantic models); the
request type is read from the first parameter's annotation.
"""

from __future__ import annotations

import errno
import faulthandler
import importlib
import inspect
import io
import json
import os
import resource
import signal
import sys
import time
import traceback
import typing
from pathlib import Path
from typing import Any

from torch_skills.runner import proctree, protocol
from torch_skills.runner.errors import UserCodeError
from torch_skills.runner.libraries import installed_imports
from torch_skills.runner.threads import run_threads
from torch_skills.runner.tracebacks import MAX_CHARS, user_location, user_traceback


class JobContext:
    """Handed to every tool function: the device to use, the allowed roots, progress reporting."""

    def __init__(self, job_dir: Path, device: str, allowed_roots: list[str], cwd: str):
        self.job_dir = job_dir
        self.device = device
        self.allowed_roots = [Path(r) for r in allowed_roots]
        self.cwd = Path(cwd)
        self.started = time.perf_counter()
        self.cpu_threads: int | None = None  # torch intra-op threads the run used (runner.threads)
        self._progress_path = job_dir / protocol.PROGRESS_FILE

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Report progress; the server relays it to the client as an MCP progress notification."""
        line = json.dumps({"progress": done, "total": total, "message": message})
        with open(self._progress_path, "a") as f:
            f.write(line + "\n")


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _isolate(write_fd: int) -> None:
    os.setsid()
    proctree.become_subreaper()  # descendants that setsid() stay in this job's tree
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # die with the zygote
    except (OSError, AttributeError):
        pass
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(write_fd, 1)
    os.dup2(write_fd, 2)
    os.closerange(3, 65536)  # the protocol pipe, other jobs' pipes: none of it is the user's business
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True, errors="replace")
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True, errors="replace")
    faulthandler.enable(file=sys.stderr)  # a segfault still leaves a Python traceback in the output
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)


def _limit_memory(limit_bytes: int, device: str, file_size_limit_bytes: int = 0) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if file_size_limit_bytes:
        # A write past the limit fails with EFBIG (OSError "File too large", named by _classify)
        # instead of killing the process with SIGXFSZ; the ignore is inherited by what the job starts.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit_bytes, file_size_limit_bytes))
    # RLIMIT_AS turns a huge CPU allocation into a clean "can't allocate memory" error. CUDA reserves
    # address space far beyond physical memory, so CUDA jobs rely on the zygote's RSS watchdog alone.
    if limit_bytes and device == "cpu":
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))


def _classify(exc: BaseException, file_size_limit_bytes: int = 0) -> tuple[str, str]:
    if isinstance(exc, UserCodeError):
        return exc.kind, exc.message
    if isinstance(exc, SystemExit):
        return (
            "sys_exit",
            f"the code called sys.exit({exc.code!r}) (or raised SystemExit). Keep the factory free of "
            "script logic: move it under `if __name__ == '__main__':`.",
        )
    text = f"{type(exc).__name__}: {exc}"
    where = user_location(exc)
    if _caused_by(exc, lambda e: isinstance(e, OSError) and e.errno == errno.EFBIG):
        limit = size_text(file_size_limit_bytes) if file_size_limit_bytes else "the limit"
        return (
            "file_too_large",
            f"a file write stopped at the per-call file size limit of {limit} "
            f"({text.splitlines()[0][:300]}{f', at {where}' if where else ''}). The tools' jobs may not write "
            "files larger than that: write less (a shorter trace, fewer profiled steps, smaller outputs).",
        )
    if isinstance(exc, MemoryError) or "can't allocate memory" in str(exc) or "out of memory" in str(exc):
        return (
            "out_of_memory",
            f"an allocation failed ({text.splitlines()[0][:300]}). Use a smaller batch or input_shape, "
            "or raise memory_limit_gib.",
        )
    if where is not None:
        return (
            "user_exception",
            f"your code raised {text.splitlines()[0][:500]} (at {where}). Fix it and call again.",
        )
    return "internal", f"torch-skills failed with {text}. This is a bug in the tool; please report it."


def size_text(n: int) -> str:
    """Bytes as '512 MiB' or '4.0 GiB' for messages."""
    return f"{n / 2**20:.0f} MiB" if n < 2**30 else f"{n / 2**30:.1f} GiB"


def _caused_by(exc: BaseException, test: typing.Callable[[BaseException], bool]) -> bool:
    """True when `exc` or an exception in its cause/context chain passes `test`."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 20:
        if test(current):
            return True
        current, seen = current.__cause__ or current.__context__, seen + 1
    return False


def _resolve(fn_path: str):
    module_name, _, attr = fn_path.partition(":")
    fn = getattr(importlib.import_module(module_name), attr)
    params = list(inspect.signature(fn).parameters.values())
    hints = typing.get_type_hints(fn)
    return fn, hints.get(params[0].name)


def run_child(message: dict[str, Any], write_fd: int, _protocol_fd: int) -> None:
    """Entry point after fork. Exits the process; never returns."""
    code = 0
    job_dir = Path(message["dir"])
    before = set(sys.modules)  # what the warm worker had: the rest was imported for this call
    device = str(message.get("device", "cpu"))  # resolved by the zygote (Zygote.device_for)
    try:
        _isolate(write_fd)
        _limit_memory(
            int(message.get("memory_limit_bytes", 0)), device, int(message.get("file_size_limit_bytes", 0))
        )
        os.chdir(message.get("cwd") or job_dir)
        ctx = JobContext(
            job_dir, device, message.get("allowed_roots", []), message.get("cwd") or str(job_dir)
        )
        fn, request_type = _resolve(message["fn"])
        payload = json.loads((job_dir / protocol.REQUEST_FILE).read_text())
        request = request_type.model_validate(payload) if hasattr(request_type, "model_validate") else payload
        # Every run's thread count is set here, before any user code (a worker may change it and
        # say so in ctx.cpu_threads, as check_distributed does for its ranks).
        ctx.cpu_threads = run_threads(getattr(request, "cpu_threads", None))
        result = fn(request, ctx)
        data = result.model_dump(mode="json") if hasattr(result, "model_dump") else result
        _write_json(
            job_dir / protocol.RESULT_FILE,
            {
                "result": data,
                "wall_time_s": time.perf_counter() - ctx.started,
                "device": str(device),
                "cpu_threads": ctx.cpu_threads,
                "libraries": installed_imports(before),
            },
        )
    except BaseException as exc:  # noqa: BLE001 - every failure must become a message, not a dead child
        kind, text = _classify(exc, int(message.get("file_size_limit_bytes", 0)))
        tb = "".join(traceback.format_exception(exc))
        try:
            if kind == "internal":
                sys.stderr.write(tb)
            else:
                tb = user_traceback(exc)
            _write_json(
                job_dir / protocol.ERROR_FILE,
                {
                    "kind": kind,
                    "message": text,
                    "traceback": tb[-MAX_CHARS:],
                    "libraries": installed_imports(before),
                },
            )
        except BaseException:  # noqa: BLE001
            code = 70
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            proctree.kill_tree(os.getpid(), include_root=False)  # nothing the job started outlives it
        except BaseException:  # noqa: BLE001
            pass
        os._exit(code)
