"""The version `crew --version` prints.

The shim's own copy of `pyproject.toml`'s version, as `crew_common.version` is
the services' (tests/common/test_console_scripts.py pins both to it): `bin/crew`
runs the shim inside the sandbox, where only this package and the standard
library can be read, so it cannot import the version from anywhere else.
"""

from __future__ import annotations

VERSION = "0.1.0"
