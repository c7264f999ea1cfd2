"""Directory trees an agent could leave behind, for the clean-up tests."""

from __future__ import annotations

import os
from pathlib import Path


def make_deep_tree(top: Path, depth: int) -> None:
    """`top/d/d/…/d` (`depth` levels, a file in each), made through dir fds (no PATH_MAX)."""
    top.mkdir(parents=True)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            with open(os.open("f", os.O_WRONLY | os.O_CREAT, dir_fd=fd), "w") as f:
                f.write("x")
            below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
    finally:
        os.close(fd)
