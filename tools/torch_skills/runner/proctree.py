"""Process trees from /proc: find every descendant of a job and kill them all.

Use it in the worker processes (no torch here):

    become_subreaper()              # orphans below this process reparent to it, not to init
    kill_tree(job_pid)              # SIGKILL the job and every descendant, new sessions included
    tree_rss_bytes(job_pid)         # resident memory of the job and all its descendants

A job's child that calls setsid() (subprocess `start_new_session=True`, a daemon's double fork)
leaves the job's process group, so killing the group misses it. With the warm worker and every
job child marked as child subreapers (PR_SET_CHILD_SUBREAPER), such a process stays inside the
tree of the job (or of the warm worker, once the job is gone), where the parent links in /proc
find it.

Known limitations: Linux only; a process that escapes by other means (asking another daemon,
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
