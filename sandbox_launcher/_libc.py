"""libc for the helper that confines a process before it execs (`landlock`, `seccomp`).

Both run inside bwrap from `landlock_exec.py` under `python -I -S`, on every
turn's path, so this uses built-in modules only (`posix`, `_ctypes`: what
`ctypes` itself is built on; `ctypes` costs milliseconds to import there).
It holds what both need: one libc call with errno kept, the errno's text, and
the error that means "this process is not confined; the command must not run".
"""

import _ctypes
import posix


class SetupError(Exception):
    """The helper could not confine this process; the command must not run."""


class _Long(_ctypes._SimpleCData):  # ctypes.c_long
    _type_ = "l"


class _LibcFunction(_ctypes.CFuncPtr):  # a CDLL function returning long, errno kept
    _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
    _restype_ = _Long


_functions: dict[str, _LibcFunction] = {}


def libc_call(name: str, *args: int | bytes | None) -> int:
    """`name(args…)` from libc. Integers go as C longs (syscall() and prctl() read
    longs), bytes as a pointer to their buffer, None as NULL."""
    function = _functions.get(name)
    if function is None:
        # dlopen(NULL): this process's own symbols, libc included (typeshed wants a name).
        libc = _ctypes.dlopen(None, 0)  # type: ignore[arg-type]
        function = _LibcFunction(_ctypes.dlsym(libc, name))
        _functions[name] = function
    return int(function(*(_Long(a) if isinstance(a, int) else a for a in args)))


def errno_text() -> str:
    """The last libc call's errno, as text with its number."""
    err = _ctypes.get_errno()
    return f"{posix.strerror(err)} (errno {err})"
