"""The version every console script reports (`--version`) and the Computer sends upstream.

Kept equal to `pyproject.toml`'s (a test checks): reading the installed
metadata instead would slow `crew`'s start-up, which runs many times a turn.
"""

from __future__ import annotations

VERSION = "0.1.0"
