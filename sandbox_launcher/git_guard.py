"""Git repositories in an agent's work directory: nothing planted in hooks or config outlives a turn.

A `.git/hooks/pre-commit` or a `core.fsmonitor` command planted by an agent
would run unsandboxed, as the user, the next time the user runs git in that
repository. Like sandbox-runtime (mandatory deny of `.git/hooks` and
`.git/config`, found by a bounded search below the working directory), each
turn looks for the repositories in `work/` (at most `MAX_DEPTH` levels down,
never following a symlink, never into `node_modules`).

Linux (issue 20): no bind mounts any more. A bind of `.git`, `hooks/` or
`config` is a mount point, so an agent could not `rm -rf` a repository it
made in an earlier turn ("Read-only file system"/"Device or resource busy"),
and a repository made during a turn was not guarded at all. Instead the
launcher takes a `Baseline` when a turn starts (each repository's hooks and
config) and, when it ends (a cold run's end, a warm server's sweep or stop),
`restore`s every repository then in `work/`, the new ones included:

- hooks: every entry that is not in the baseline unchanged is removed (a
  changed one gets its old content back); `*.sample` files stay (git never
  runs them). A new repository keeps only its samples.
- config: entries that were in the baseline, or whose key is on a short
  allow-list of keys git never executes anything for (`SAFE_CONFIG_KEYS`:
  remotes, branches, user name and email, core format settings), are kept;
  everything else (`core.fsmonitor`, `core.hooksPath`, `core.sshCommand`,
  `core.pager`, aliases, filters, `include.path`…) is dropped and the file
  rewritten. Read with `git config --no-includes --list` (it runs nothing).
- a `commondir` the turn planted (it moves where git reads config and hooks
  from) is deleted.

What is left open (README, next to the work directory): while a turn runs,
a git the user starts by hand in that work directory can run what the turn
planted so far; repositories deeper than `MAX_DEPTH`, or reached through a
`.git` file (a gitlink), are not looked at. On macOS Seatbelt still denies
writes to `hooks/`, `config`, `commondir` and the `.git` entry of the
repositories that existed when the turn started (a path that does not exist
yet can be denied there too), and the same restore runs after each turn.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

MAX_DEPTH = 3  # work/.git, work/a/.git, work/a/b/.git (sandbox-runtime searches 3 deep)
MAX_DIRECTORIES = 2000  # directories listed per run, at most: a huge tree is cut short
SKIPPED = frozenset({"node_modules", ".venv", "__pycache__"})
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def find_git_dirs(work_dir: Path) -> list[Path]:
    """The real `.git` directories in `work_dir` and below (breadth first, bounded)."""
    found: list[Path] = []
    level = [work_dir]
    listed = 0
    for _depth in range(MAX_DEPTH):
        below: list[Path] = []
        for directory in level:
            if listed >= MAX_DIRECTORIES:
                log.warning("stopped looking for repositories after %d directories", listed)
                return found
            listed += 1
            try:
                with os.scandir(directory) as entries:
                    for entry in entries:
                        if not entry.is_dir(follow_symlinks=False):
                            continue
                        if entry.name == ".git":
                            found.append(Path(entry.path))
                        elif entry.name not in SKIPPED:
                            below.append(Path(entry.path))
            except OSError as exc:
                log.warning("cannot look for repositories in %s: %s", directory, exc)
        level = below
    return found


def _entry_mode(dir_fd: int, name: str) -> int | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None


def prepare_guard(git_dir: Path) -> bool:
    """Make sure `hooks/` and `config` exist as a real directory and file; True when guardable.

    Works through a descriptor of `git_dir` opened without following links, so
    nothing outside the repository is ever created.
    """
    try:
        fd = os.open(git_dir, _DIR_FLAGS)
    except OSError as exc:
        log.warning("not guarding %s: %s", git_dir, exc)
        return False
    try:
        hooks, config = _entry_mode(fd, "hooks"), _entry_mode(fd, "config")
        if hooks is None:
            os.mkdir("hooks", 0o755, dir_fd=fd)
        elif not stat.S_ISDIR(hooks):
            log.warning("not guarding %s: its hooks is not a directory (a link?)", git_dir)
            return False
        if config is None:
            os.close(os.open("config", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=fd))
        elif not stat.S_ISREG(config):
            log.warning("not guarding %s: its config is not a regular file (a link?)", git_dir)
            return False
        return True
    except OSError as exc:
        log.warning("not guarding %s: %s", git_dir, exc)
        return False
    finally:
        os.close(fd)


def guarded_git_dirs(work_dir: Path) -> tuple[Path, ...]:
    """The repositories of `work_dir` whose hooks and config a run may not change."""
    return tuple(g for g in find_git_dirs(work_dir) if prepare_guard(g))


# ---- the turn's baseline, and restoring it (Linux and macOS) ----

MAX_HOOK_BYTES = 1 << 20  # a baseline hook bigger than this is removed if changed, not restored
GIT_CANDIDATES = ("/usr/bin/git", "/usr/local/bin/git", "/bin/git", "/opt/homebrew/bin/git")
GIT_TIMEOUT_S = 10.0
# Keys (as `git config --list` prints them: section and name lower case) for which git
# never runs a program, opens a pager or includes another file. Anything else a turn
# adds to a repository's config is dropped after the turn.
SAFE_CONFIG_KEYS = re.compile(
    r"core\.(repositoryformatversion|filemode|bare|logallrefupdates|ignorecase"
    r"|precomposeunicode|symlinks|autocrlf|eol|safecrlf|quotepath|compression"
    r"|bigfilethreshold|checkstat|trustctime)"
    r"|remote\..+\.(url|pushurl|fetch|push|tagopt|prune|mirror)"
    r"|branch\..+\.(remote|merge|rebase|pushremote|description)"
    r"|(user|author|committer)\.(name|email)"
    r"|init\.defaultbranch|extensions\.(objectformat|refstorage)"
    r"|pull\.(rebase|ff)|push\.(default|autosetupremote|followtags)|merge\.ff|fetch\.prune"
)
MINIMAL_CONFIG = b"[core]\n\trepositoryformatversion = 0\n\tbare = false\n"

ConfigEntry = tuple[str, str | None]  # key, value (None: a key given without "=")


@dataclass(frozen=True)
class Hook:
    digest: str
    mode: int
    content: bytes | None  # None: too big to keep (removed if changed)


@dataclass(frozen=True)
class RepoState:
    """What git would run from one `.git` when the turn started."""

    hooks: dict[str, Hook]
    config: bytes | None  # None: no regular config file
    config_entries: frozenset[ConfigEntry]
    has_commondir: bool


@dataclass(frozen=True)
class Baseline:
    """The repositories of a work directory when a turn started."""

    work_dir: Path
    repos: dict[Path, RepoState] = field(default_factory=dict)


def _hooks_of(git_fd: int) -> dict[str, Hook]:
    hooks: dict[str, Hook] = {}
    try:
        fd = os.open("hooks", _DIR_FLAGS, dir_fd=git_fd)
    except OSError:
        return hooks  # missing, or a link: nothing of it is kept
    try:
        for entry in os.scandir(fd):
            if not entry.is_file(follow_symlinks=False) or entry.name.endswith(".sample"):
                continue
            data = _read_file(fd, entry.name)
            if data is None:
                continue
            mode = entry.stat(follow_symlinks=False).st_mode & 0o7777
            kept = data if len(data) <= MAX_HOOK_BYTES else None
            hooks[entry.name] = Hook(hashlib.sha256(data).hexdigest(), mode, kept)
    finally:
        os.close(fd)
    return hooks


def open_below(work_dir: Path, git_dir: Path) -> int:
    """A descriptor of `git_dir`, reached from `work_dir` one directory at a time without
    following a link: a path swapped for a link to the user's own repository since it
    was found is never touched (the launcher may be root)."""
    fd = os.open(work_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in git_dir.relative_to(work_dir).parts:
            below = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = below
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_file(dir_fd: int, name: str) -> bytes | None:
    """A regular file's bytes, read without following a link; None when there is none."""
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd
        )
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def find_git() -> str | None:
    """git at a fixed place (the one on PATH could be a tool's)."""
    return next((g for g in GIT_CANDIDATES if os.access(g, os.X_OK)), None)


def parse_config_list(output: bytes) -> list[ConfigEntry]:
    """`git config --list -z` output → (key, value) in order. Pure."""
    entries: list[ConfigEntry] = []
    for record in output.split(b"\0"):
        if not record:
            continue
        key, newline, value = record.decode("utf-8", "surrogateescape").partition("\n")
        entries.append((key, value if newline else None))
    return entries


def config_entries(config: bytes) -> list[ConfigEntry] | None:
    """The entries of a config file's bytes as git reads them (no includes: git gets the
    bytes on stdin, never a path); None: git refuses them, or there is no git."""
    git = find_git()
    if git is None:
        return None
    env = {"PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"}
    try:
        done = subprocess.run(
            [git, "config", "--file", "-", "--no-includes", "--list", "-z"],
            input=config,
            capture_output=True,
            env=env,
            cwd="/",
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("git could not read a repository's config: %s", exc)
        return None
    return parse_config_list(done.stdout) if done.returncode == 0 else None


def config_text(entries: Iterable[ConfigEntry]) -> bytes:
    """A config file holding exactly `entries`, in order. Pure."""

    def quoted(value: str) -> str:
        for raw, escaped in (("\\", "\\\\"), ('"', '\\"'), ("\n", "\\n"), ("\t", "\\t")):
            value = value.replace(raw, escaped)
        return f'"{value}"'

    lines: list[str] = []
    header: tuple[str, str] | None = None
    for key, value in entries:
        section, _, rest = key.partition(".")
        sub, _, name = rest.rpartition(".")
        if (section, sub) != header:
            header = (section, sub)
            sub_text = sub.replace("\\", "\\\\").replace('"', '\\"')
            lines.append(f'[{section} "{sub_text}"]' if sub else f"[{section}]")
        lines.append(f"\t{name}" if value is None else f"\t{name} = {quoted(value)}")
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")


def kept_entries(entries: list[ConfigEntry], before: frozenset[ConfigEntry]) -> list[ConfigEntry]:
    """The entries a turn may leave: those it found, and safe keys. Pure."""
    return [e for e in entries if e in before or SAFE_CONFIG_KEYS.fullmatch(e[0])]


def repo_state(git_fd: int) -> RepoState:
    config = _read_file(git_fd, "config")
    entries = config_entries(config) if config is not None else None
    return RepoState(
        hooks=_hooks_of(git_fd),
        config=config,
        config_entries=frozenset(entries or ()),
        has_commondir=_exists(git_fd, "commondir"),
    )


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def baseline(work_dir: Path) -> Baseline:
    """The repositories of `work_dir` now: what `restore` goes back to after the turn."""
    repos = {}
    for git_dir in find_git_dirs(work_dir):
        try:
            fd = open_below(work_dir, git_dir)
        except OSError as exc:
            log.warning("git guard: cannot look at %s: %s", git_dir, exc)
            continue
        try:
            repos[git_dir] = repo_state(fd)
        finally:
            os.close(fd)
    return Baseline(work_dir, repos)


def restore(before: Baseline) -> list[str]:
    """Undo what a turn planted in the repositories of the work dir (module doc).

    Every repository found now is restored, the new ones too. Never raises;
    returns (and logs) what was undone.
    """
    undone: list[str] = []
    for git_dir in find_git_dirs(before.work_dir):
        try:
            fd = open_below(before.work_dir, git_dir)
        except OSError as exc:
            undone.append(f"{git_dir}: could not be checked ({exc})")
            continue
        try:
            undone += _restore_repo(git_dir, fd, before.repos.get(git_dir))
        except OSError as exc:
            undone.append(f"{git_dir}: could not be checked ({exc})")
        finally:
            os.close(fd)
    for line in undone:
        log.warning("git guard: %s", line)
    return undone


def _restore_repo(git_dir: Path, fd: int, was: RepoState | None) -> list[str]:
    undone = [f"{git_dir}/hooks: {u}" for u in _restore_hooks(fd, was.hooks if was else {})]
    if (was is None or not was.has_commondir) and _remove(fd, "commondir"):
        undone.append(f"{git_dir}: removed the commondir the turn planted")
    why = _restore_config(fd, was)
    if why:
        undone.append(f"{git_dir}/config: {why}")
    return undone


def _remove(dir_fd: int, name: str) -> bool:
    """Remove `name` (a file, a link, or a whole directory) below `dir_fd`; True if it was there."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)
    return True


def _write_file(dir_fd: int, name: str, data: bytes, mode: int, owner: tuple[int, int]) -> None:
    """Replace `name` with `data` (written aside, then renamed over it)."""
    temp = f".{name}.crew-restore"
    with_flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    _remove(dir_fd, temp)
    fd = os.open(temp, with_flags, mode & 0o777, dir_fd=dir_fd)
    try:
        os.write(fd, data)
        if os.getuid() == 0:
            os.fchown(fd, *owner)  # the agent's engine may run as another uid (issue 20)
        os.fchmod(fd, mode & 0o777)
    finally:
        os.close(fd)
    os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def _restore_hooks(git_fd: int, hooks: dict[str, Hook]) -> list[str]:
    try:
        mode = os.stat("hooks", dir_fd=git_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return []
    if not stat.S_ISDIR(mode):
        _remove(git_fd, "hooks")
        return ["removed (not a directory: a link?)"]
    undone = []
    owner = os.stat(".", dir_fd=git_fd)
    fd = os.open("hooks", _DIR_FLAGS, dir_fd=git_fd)
    try:
        for entry in list(os.scandir(fd)):
            name = entry.name
            is_file = entry.is_file(follow_symlinks=False)
            if is_file and name.endswith(".sample"):
                continue
            was = hooks.get(name)
            data = _read_file(fd, name) if is_file else None
            now_mode = entry.stat(follow_symlinks=False).st_mode & 0o7777
            digest = hashlib.sha256(data).hexdigest() if data is not None else None
            if was is not None and digest == was.digest and now_mode == was.mode:
                continue
            _remove(fd, name)
            if was is not None and was.content is not None:
                _write_file(fd, name, was.content, was.mode, (owner.st_uid, owner.st_gid))
                undone.append(f"{name} changed by the turn: restored")
            else:
                undone.append(f"{name} planted by the turn: removed")
    finally:
        os.close(fd)
    return undone


def _restore_config(git_fd: int, was: RepoState | None) -> str | None:
    now = _read_file(git_fd, "config")
    if was is not None and now == was.config:
        return None
    try:
        mode = os.stat("config", dir_fd=git_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None  # git will not use this repository without one: nothing runs
    owner = os.stat(".", dir_fd=git_fd)
    ids = (owner.st_uid, owner.st_gid)
    fallback = was.config if was is not None and was.config is not None else MINIMAL_CONFIG
    if now is None:
        _remove(git_fd, "config")
        _write_file(git_fd, "config", fallback, 0o644, ids)
        return "not a regular file (a link?): replaced"
    entries = config_entries(now)
    if entries is None:
        _write_file(git_fd, "config", fallback, stat.S_IMODE(mode), ids)
        return "unreadable for git, or no git to read it: restored"
    kept = kept_entries(entries, was.config_entries if was else frozenset())
    if kept == entries:
        return None
    _write_file(git_fd, "config", config_text(kept), stat.S_IMODE(mode), ids)
    dropped = sorted({key for key, _ in entries} - {key for key, _ in kept})
    return f"dropped what the turn set: {', '.join(dropped)}"
