"""safe_fs: never follow a symlink, never block on a FIFO, atomic 0600 writes."""

from __future__ import annotations

import os
import pwd
import stat
import threading
from pathlib import Path

import pytest

from computer_service import safe_fs
from computer_service.safe_fs import UnsafePath
from tests.support.ci import required_in_ci
from tests.support.trees import make_deep_tree


def mode_of(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_ensure_dir_creates_every_level_0700(tmp_path: Path) -> None:
    root = tmp_path / "root"
    safe_fs.ensure_dir(root, root / "a" / "b" / "c")
    for p in (root / "a", root / "a" / "b", root / "a" / "b" / "c"):
        assert p.is_dir() and not p.is_symlink()
        assert mode_of(p) == 0o700


def test_ensure_dir_resets_mode_of_existing(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir(mode=0o755)
    safe_fs.ensure_dir(tmp_path, "x")
    assert mode_of(tmp_path / "x") == 0o700


@pytest.mark.parametrize("level", ["a", "a/b"])
def test_ensure_dir_refuses_symlinked_level(tmp_path: Path, level: str) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "root"
    target = root / level
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(elsewhere)
    with pytest.raises(UnsafePath, match="symlink"):
        safe_fs.ensure_dir(root, "a/b/c")
    assert list(elsewhere.iterdir()) == []


def test_ensure_dir_refuses_file_in_place_of_dir(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("x")
    with pytest.raises(UnsafePath, match="file, not a directory"):
        safe_fs.ensure_dir(tmp_path, "a/b")


def test_paths_outside_root_and_dotdot_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsafePath, match="outside"):
        safe_fs.ensure_dir(tmp_path / "r", tmp_path / "other")
    with pytest.raises(UnsafePath, match=r"\.\."):
        safe_fs.ensure_dir(tmp_path, "a/../../b")


def test_write_file_atomic_writes_0600_and_replaces(tmp_path: Path) -> None:
    safe_fs.write_file_atomic(tmp_path, "d/f.txt", b"one")
    f = tmp_path / "d" / "f.txt"
    assert f.read_bytes() == b"one"
    assert mode_of(f) == 0o600
    assert mode_of(tmp_path / "d") == 0o700
    safe_fs.write_file_atomic(tmp_path, "d/f.txt", b"two")
    assert f.read_bytes() == b"two"
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["f.txt"]  # no temp left


def test_write_file_atomic_replaces_symlink_never_follows(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    root = tmp_path / "root"
    root.mkdir()
    (root / "token").symlink_to(victim)
    safe_fs.write_file_atomic(root, "token", b"secret")
    assert victim.read_text() == "keep"
    assert not (root / "token").is_symlink()
    assert (root / "token").read_bytes() == b"secret"


def test_write_file_atomic_through_symlinked_parent_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    (root / "sub").symlink_to(elsewhere)
    with pytest.raises(UnsafePath, match="symlink"):
        safe_fs.write_file_atomic(root, "sub/f", b"x")
    assert list(elsewhere.iterdir()) == []


def test_write_file_atomic_onto_directory_refused(tmp_path: Path) -> None:
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "inside").write_text("x")
    with pytest.raises(UnsafePath, match="directory"):
        safe_fs.write_file_atomic(tmp_path, "f", b"x")
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_read_regular_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"data")
    assert safe_fs.read_regular_file(tmp_path, "f", 100) == b"data"
    assert safe_fs.read_regular_file(tmp_path, "missing", 100) is None
    assert safe_fs.read_regular_file(tmp_path, "nodir/f", 100) is None
    with pytest.raises(UnsafePath, match="limit"):
        safe_fs.read_regular_file(tmp_path, "f", 3)


def test_read_symlink_counts_as_absent(tmp_path: Path) -> None:
    (tmp_path / "real").write_text("secret")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert safe_fs.read_regular_file(tmp_path, "link", 100) is None


@pytest.mark.timeout(10)
def test_read_fifo_counts_as_absent_and_never_blocks(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "session.json")
    result: list[bytes | None] = []
    t = threading.Thread(
        target=lambda: result.append(safe_fs.read_regular_file(tmp_path, "session.json", 100))
    )
    t.start()
    t.join(5)
    assert not t.is_alive(), "reading a FIFO blocked"
    assert result == [None]


def test_read_directory_counts_as_absent(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    assert safe_fs.read_regular_file(tmp_path, "d", 100) is None


def test_lstat_entry_sees_symlink_itself(tmp_path: Path) -> None:
    (tmp_path / "l").symlink_to("/nonexistent")
    st = safe_fs.lstat_entry(tmp_path, "l")
    assert st is not None and stat.S_ISLNK(st.st_mode)
    assert safe_fs.lstat_entry(tmp_path, "nope") is None


def test_copy_if_newer(tmp_path: Path) -> None:
    src = tmp_path / "models.json"
    src.write_text("v1")
    os.utime(src, (1_000_000, 1_000_000))
    root = tmp_path / "root"
    assert safe_fs.copy_if_newer(src, root, "cache/opencode/models.json", 1 << 20) is True
    dst = root / "cache" / "opencode" / "models.json"
    assert dst.read_text() == "v1" and mode_of(dst) == 0o600
    # Not older: skipped, even if contents differ.
    src.write_text("v2")
    os.utime(src, (1_000_000, 1_000_000))
    assert safe_fs.copy_if_newer(src, root, "cache/opencode/models.json", 1 << 20) is False
    assert dst.read_text() == "v1"
    # Source newer: copied.
    os.utime(src, (2_000_000, 2_000_000))
    assert safe_fs.copy_if_newer(src, root, "cache/opencode/models.json", 1 << 20) is True
    assert dst.read_text() == "v2"
    assert safe_fs.copy_if_newer(tmp_path / "missing", root, "x", 10) is False


def test_copy_if_newer_never_through_a_link(tmp_path: Path) -> None:
    src = tmp_path / "models.json"
    src.write_text("prices")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    (root / "cache").symlink_to(elsewhere)
    with pytest.raises(UnsafePath):
        safe_fs.copy_if_newer(src, root, "cache/opencode/models.json", 1 << 20)
    assert list(elsewhere.iterdir()) == []
    # A symlink at the file itself, pointing at a newer file, is replaced, not trusted.
    (root / "cache").unlink()
    (root / "cache").mkdir()
    target = elsewhere / "t"
    target.write_text("old")
    (root / "cache" / "models.json").symlink_to(target)
    assert safe_fs.copy_if_newer(src, root, "cache/models.json", 1 << 20) is True
    assert target.read_text() == "old"
    assert (root / "cache" / "models.json").read_text() == "prices"


def test_remove_tree_and_clear_dir_do_not_follow_links(tmp_path: Path) -> None:
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "precious").write_text("x")
    root = tmp_path / "root"
    (root / "runtime" / "old" / "deep").mkdir(parents=True)
    (root / "runtime" / "old" / "deep" / "link").symlink_to(keep)
    (root / "runtime" / "stray-link").symlink_to(keep)
    (root / "runtime" / "file").write_text("x")
    safe_fs.clear_dir(root, "runtime")
    assert (root / "runtime").is_dir() and list((root / "runtime").iterdir()) == []
    assert (keep / "precious").exists()
    (root / "runtime" / "r1" / "x").mkdir(parents=True)
    safe_fs.remove_tree(root, "runtime/r1")
    assert not (root / "runtime" / "r1").exists()
    safe_fs.remove_tree(root, "runtime/r1")  # missing is fine


def test_clear_dir_refuses_symlinked_dir(tmp_path: Path) -> None:
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "precious").write_text("x")
    root = tmp_path / "root"
    root.mkdir()
    (root / "runtime").symlink_to(keep)
    with pytest.raises(UnsafePath):
        safe_fs.clear_dir(root, "runtime")
    assert (keep / "precious").exists()


def open_fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_tree_1500_levels_deep_is_removed_within_a_small_fd_limit(tmp_path: Path) -> None:
    """Red team escape 5: `shutil.rmtree` raised RecursionError here and the Computer died."""
    import resource
    import shutil

    root = tmp_path / "root"
    make_deep_tree(root / "runtime" / "r1" / "tmp", 1500)
    with pytest.raises(RecursionError):  # the control: what the old code met
        shutil.rmtree(root / "runtime" / "r1" / "tmp" / "d")
    make_deep_tree(root / "runtime" / "r2", 1500)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # Room for what is open now and a handful more: depth must not cost descriptors.
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_fd_count() + 8, hard))
    try:
        safe_fs.remove_tree(root, "runtime/r1")
        safe_fs.clear_dir(root, "runtime")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert list((root / "runtime").iterdir()) == []


def test_move_aside_renames_without_following(tmp_path: Path) -> None:
    keep = tmp_path / "keep"
    keep.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    (root / "runtime").symlink_to(keep)
    safe_fs.move_aside(root, "runtime", "runtime.stale-1")
    assert (root / "runtime.stale-1").is_symlink() and keep.is_dir()


def test_as_root_what_is_created_belongs_to_the_directorys_owner(tmp_path: Path) -> None:
    """A root Computer's files in a directory of the engine user's are that user's (issue 20)."""
    if os.getuid() != 0:
        required_in_ci("root (only root creates files for another owner)")
    nobody = pwd.getpwnam("nobody")
    ids = (nobody.pw_uid, nobody.pw_gid)
    (tmp_path / "agent").mkdir()
    os.chown(tmp_path / "agent", *ids)
    safe_fs.write_file_atomic(tmp_path, "agent/AGENTS.md", b"x")
    safe_fs.ensure_dir(tmp_path, "agent/engines/opencode")
    safe_fs.restore_dirs(tmp_path, "agent", ["work/deep"])
    safe_fs.write_file_atomic(tmp_path, "mine.txt", b"the Computer's own")
    for name in ("agent/AGENTS.md", "agent/engines", "agent/engines/opencode", "agent/work/deep"):
        st = (tmp_path / name).lstat()
        assert (st.st_uid, st.st_gid) == ids, name
    assert (tmp_path / "mine.txt").stat().st_uid == 0
