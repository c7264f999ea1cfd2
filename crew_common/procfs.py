"""What /proc tells about a process that the Computer and the launcher both check."""

from __future__ import annotations


def process_start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (clock ticks after boot), or None when the process is gone.

    With the pid it names one process: a reused pid has another start time.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # "pid (comm) state ppid …": comm may hold spaces and parentheses.
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 else None
