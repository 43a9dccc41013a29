"""Messages between the server's pool and the warm worker, one JSON object per line.

server -> worker:  {"op": "run", "job": id, "dir": job_dir, "fn": "pkg.mod:func", "cwd": ...,
                    "memory_limit_bytes": n, "file_size_limit_bytes": n, "device": "auto"|"cpu"|"cuda"}
                   {"op": "kill", "job": id}
                   {"op": "preload", "modules": [names]}   (imported when no job runs; runner.libraries)
worker -> server:  {"event": "ready", "pid": n, "torch": "2.13.0"}
                   {"event": "started", "job": id, "pid": n}
                   {"event": "exited", "job": id, "returncode": n|null, "signal": n|null,
                    "killed_for": "memory"|"request"|null, "peak_rss_bytes": n,
                    "output": text, "output_bytes": n, "output_truncated": bool}
                   {"event": "preload_unsafe", "library": name, "reason": text}  (then the worker exits)
                   {"event": "unusable", "message": text, "python": path}  (instead of "ready")
The request payload and the result travel as files in the job directory (names below), so the
pipe never carries user-sized data.
"""

from __future__ import annotations

import json
from typing import Any

REQUEST_FILE = "request.json"
RESULT_FILE = "result.json"
ERROR_FILE = "error.json"
PROGRESS_FILE = "progress.jsonl"

OUTPUT_HEAD_BYTES = 4 * 1024
OUTPUT_TAIL_BYTES = 12 * 1024


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


def decode(line: bytes) -> dict[str, Any]:
    return json.loads(line)


class OutputBuffer:
    """Keeps the first and last few KiB of what a child printed, however much it printed."""

    def __init__(self, head: int = OUTPUT_HEAD_BYTES, tail: int = OUTPUT_TAIL_BYTES):
        self._head_limit, self._tail_limit = head, tail
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self._head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self._tail_limit:
                del self.tail[: len(self.tail) - self._tail_limit]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + min(len(self.tail), self._tail_limit)

    def text(self) -> str:
        tail = bytes(self.tail[-self._tail_limit :])
        head = bytes(self.head)
        if self.truncated:
            skipped = self.total - len(head) - len(tail)
            middle = f"\n[... {skipped} bytes of output skipped ...]\n".encode()
            return (head + middle + tail).decode(errors="replace")
        return (head + tail).decode(errors="replace")
