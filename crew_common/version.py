"""The version the services' console scripts report (`--version`) and the Computer sends upstream.

Kept equal to `pyproject.toml`'s (a test checks): reading the installed
metadata instead would slow start-up. `crew` has its own copy
(`crew_shim.version`): the shim imports nothing outside its package.
"""

from __future__ import annotations

VERSION = "0.1.0"
