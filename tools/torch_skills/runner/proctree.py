"""Process trees from /proc: find every descendant of a job and kill them all.

Use it in the worker processes (no torch here):

    become_subreaper()              # orphans below this process reparent to it, not to init
    kill_tree(job_pid)              # SIGKILL the job and every descendant, new sessions included
    tree_rss_bytes(job_pid)         # resident memory of the job and all its descendants
    tree_memory_bytes(job_pid)      # ...plus the shared memory they hold (memfd, /dev/shm)

A job's child that calls setsid() (subprocess `start_new_session=True`, a daemon's double fork)
leaves the job's process group, so killing the group misses it. With the warm worker and every
job child marked as child subreapers (PR_SET_CHILD_SUBREAPER), such a process stays inside the
tree of the job (or of the warm worker, once the job is gone), where the parent links in /proc
find it.

Known limitations: Linux only; tree_memory_bytes sees shared memory a process maps or holds a
file descriptor to, not a /dev/shm file written and closed without a mapping (/dev/shm's own
size limit applies to that), nor files on a tmpfs /tmp (bounded by RLIMIT_FSIZE per file); a process that escapes by other means (asking another daemon,
e.g. systemd-run or a container runtime, to start it) is not a descendant and is not found.
"""

from __future__ import annotations

import os
import signal

PR_SET_CHILD_SUBREAPER = 36
_PAGE = os.sysconf("SC_PAGE_SIZE")


def become_subreaper() -> bool:
    """Mark this process a child subreaper; False where the kernel or libc does not allow it."""
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def process_table() -> dict[int, tuple[int, int]]:
    """{pid: (parent pid, process group)} of every process visible in /proc."""
    table: dict[int, tuple[int, int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # the command name may hold spaces and ')'
        try:
            table[int(name)] = (int(fields[1]), int(fields[2]))
        except (IndexError, ValueError):
            continue
    return table


def descendants(pid: int, table: dict[int, tuple[int, int]] | None = None) -> set[int]:
    """Every process below `pid` by parent links, plus every member of `pid`'s process group."""
    table = process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found: set[int] = {p for p, (_, group) in table.items() if group == pid and p != pid}
    stack = [pid, *found]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    found.discard(pid)
    return found


def _signal(pids: set[int], sig: int) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except OSError:
            pass


def kill_tree(pid: int, *, include_root: bool = True) -> None:
    """SIGKILL `pid` and all its descendants. Stops them first so none can fork a new one meanwhile."""
    for _ in range(5):  # a process forked between the scan and the kill is caught by the next pass
        found = descendants(pid)
        if include_root:
            found.add(pid)
        alive = {p for p in found if os.path.exists(f"/proc/{p}")}
        if not alive:
            return
        _signal(alive, signal.SIGSTOP)
        _signal(alive, signal.SIGKILL)
        if not include_root and not descendants(pid):
            return


def kill_orphans(parent: int, keep: set[int]) -> None:
    """Kill the trees of `parent`'s children that are not in `keep` (orphans reparented to a subreaper)."""
    table = process_table()
    for child, (ppid, _) in table.items():
        if ppid == parent and child not in keep:
            kill_tree(child)


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def tree_rss_bytes(pid: int) -> int:
    """Resident bytes of `pid` and all its descendants (DataLoader workers, escaped sessions)."""
    return _rss(pid) + sum(_rss(p) for p in descendants(pid))


_SHARED_PREFIXES = ("/memfd:", "/dev/shm/")


def _memory_split(pid: int) -> tuple[int, int]:
    """(resident bytes other than shared memory, resident shared memory bytes) of one process."""
    private = shared = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("RssAnon:", "RssFile:")):
                    private += int(line.split()[1]) * 1024
                elif line.startswith("RssShmem:"):
                    shared = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 0, 0
    return private, shared


def _shared_files(pid: int, into: dict[tuple[int, int], int]) -> None:
    """Add the memfds and /dev/shm files `pid` holds open to `into` ({(dev, inode): allocated bytes})."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return
    for fd in fds:
        path = f"/proc/{pid}/fd/{fd}"
        try:
            if not os.readlink(path).startswith(_SHARED_PREFIXES):
                continue
            st = os.stat(path)
        except OSError:
            continue
        into[(st.st_dev, st.st_ino)] = st.st_blocks * 512


def tree_memory_bytes(pid: int) -> int:
    """Memory `pid` and its descendants hold: resident memory plus shared memory (memfd, /dev/shm).

    Shared memory a job writes through a file descriptor (a memfd filled with write() or
    fallocate()) is not resident in any process, so RSS alone misses it. Each shared object is
    counted once by inode; mapped shared memory (RssShmem) and the objects behind open descriptors
    overlap, so the larger of the two totals is taken rather than their sum."""
    private = mapped_shared = 0
    files: dict[tuple[int, int], int] = {}
    for p in (pid, *descendants(pid)):
        own, shared = _memory_split(p)
        private += own
        mapped_shared += shared
        _shared_files(p, files)
    return private + max(mapped_shared, sum(files.values()))
