"""The run directory: `runtime/` cleaned (or moved aside) at start, `bin/crew`, deleted at exit."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import crew_shim
from computer_service.run_dir import RunDirectory, RunDirectoryError, crew_wrapper_script
from tests.support.ci import required_in_ci
from tests.support.trees import make_deep_tree


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_run_directory_cleans_writes_wrapper_and_removes(tmp_path: Path) -> None:
    crew = tmp_path / "crew"
    stale = crew / "runtime" / "old-run" / "agents" / "x"
    stale.mkdir(parents=True)
    keep = tmp_path / "keep"
    keep.mkdir()
    (stale / "link").symlink_to(keep)
    (crew / "runtime" / "stray").write_text("x")
    run = RunDirectory(crew, "run-2")
    run.prepare()
    assert sorted(p.name for p in (crew / "runtime").iterdir()) == ["run-2"]
    assert keep.exists()
    wrapper = crew / "runtime" / "run-2" / "bin" / "crew"
    assert mode(wrapper) == 0o700
    text = wrapper.read_text()
    assert text.startswith(f"#!/bin/sh\nexec {sys.executable} -I -S -c ")
    assert text.endswith(' "$@"\n') and "from crew_shim.__main__ import main" in text
    assert mode(crew) == 0o700 and mode(crew / "runtime") == 0o700
    run.remove()
    assert not (crew / "runtime" / "run-2").exists()
    run.remove()  # twice is fine


def test_wrapper_runs_the_interpreter_isolated(tmp_path: Path) -> None:
    """bin/crew execs the interpreter with -I: check with a stand-in interpreter script."""
    fake = tmp_path / "fake python"
    fake.write_text('#!/bin/sh\nprintf "%s|" "$@"\n')
    fake.chmod(0o755)
    run = RunDirectory(tmp_path / "crew", "r", interpreter=str(fake))
    run.prepare()
    out = subprocess.run(
        [str(run.bin_dir / "crew"), "reply", "a b", "$x"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.startswith("-I|-S|-c|")
    assert out.stdout.endswith("|reply|a b|$x|")


def test_the_wrapper_starts_the_shim_without_site_and_from_its_own_directory(
    tmp_path: Path,
) -> None:
    """The real interpreter on a copy of the shim: no `site` (no venv finder) is imported,
    the shim is the copy in the given directory (found by location, not on a path), and
    the arguments arrive as given."""
    copy = tmp_path / "elsewhere" / "crew_shim"
    shutil.copytree(Path(crew_shim.__file__).resolve().parent, copy)
    (copy / "__main__.py").write_text(
        "import sys\n"
        "def main():\n"
        "    import crew_shim\n"
        "    print('site' in sys.modules, crew_shim.__file__, sys.argv[1:])\n"
        "    return 3\n"
    )
    wrapper = tmp_path / "crew"
    wrapper.write_text(crew_wrapper_script(sys.executable, copy))
    wrapper.chmod(0o700)
    out = subprocess.run(
        [str(wrapper), "reply", "a b", "$x"], capture_output=True, text=True, check=False
    )
    assert out.returncode == 3, out.stderr
    assert out.stdout.strip() == f"False {copy / '__init__.py'} ['reply', 'a b', '$x']"


def test_the_real_wrapper_runs_the_shim(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path / "crew", "r")
    run.prepare()
    out = subprocess.run(
        [str(run.bin_dir / "crew"), "--help"], capture_output=True, text=True, check=True
    )
    assert "crew reply" in out.stdout


def test_stop_removes_a_1500_level_tree_an_agent_left(tmp_path: Path) -> None:
    """Red team escape 5: this raised RecursionError at stop, and the Computer exited 1."""
    crew = tmp_path / "crew"
    run = RunDirectory(crew, "r")
    run.prepare()
    make_deep_tree(run.path / "agents" / "a1" / "tmp" / "bomb", 1500)
    run.remove()
    assert not run.path.exists()


@pytest.fixture
def immutable_file(tmp_path: Path) -> Iterator[Path]:
    """A file not even root can delete (`chattr +i`); made mutable again afterwards."""
    path = tmp_path / "crew" / "runtime" / "old-run" / "agents" / "a1" / "tmp" / "stuck"
    path.parent.mkdir(parents=True)
    path.write_text("x")
    done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False)
    if done.returncode != 0:
        required_in_ci("chattr +i (root, on ext4/xfs/btrfs)")
    try:
        yield path
    finally:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True, check=False)


def test_an_undeletable_runtime_is_moved_aside_not_fatal(
    tmp_path: Path, immutable_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    crew = tmp_path / "crew"
    RunDirectory(crew, "r2").prepare()
    assert sorted(p.name for p in (crew / "runtime").iterdir()) == ["r2"]
    stale = [p for p in crew.iterdir() if p.name.startswith("runtime.stale-")]
    assert len(stale) == 1 and (stale[0] / "old-run").is_dir()
    assert "moving it aside" in caplog.text
    # Once it can be deleted, the next start does.
    stuck = stale[0] / immutable_file.relative_to(crew / "runtime")
    subprocess.run(["chattr", "-i", str(stuck)], check=True)
    RunDirectory(crew, "r3").prepare()
    assert sorted(p.name for p in crew.iterdir()) == ["runtime"]


def test_run_directory_refuses_symlinked_runtime(tmp_path: Path) -> None:
    crew = tmp_path / "crew"
    crew.mkdir()
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "precious").write_text("x")
    (crew / "runtime").symlink_to(keep)
    with pytest.raises(RunDirectoryError, match="symlink"):
        RunDirectory(crew, "r").prepare()
    assert (keep / "precious").exists()


def test_interpreter_dirs_cover_prefix_and_shim() -> None:
    dirs = RunDirectory(Path("/nonexistent"), "r").interpreter_dirs()
    assert Path(sys.prefix).resolve() in dirs
    assert any((d / "__main__.py").exists() or d.name == "crew_shim" for d in dirs)
    assert len(dirs) == len(set(dirs))
