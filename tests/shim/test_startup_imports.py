"""What `crew reply` imports at its start (crew_shim/README.md "Start-up cost"): none of the
modules that cost milliseconds on the path of every reply (issue 26)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import crew_shim
from computer_service.run_dir import crew_wrapper_script

HEAVY = ("hashlib", "_hashlib", "urllib.parse", "ipaddress", "importlib.util", "http.client")


def test_crew_reply_loads_none_of_the_heavy_modules(tmp_path: Path) -> None:
    shim = Path(crew_shim.__file__).resolve().parent
    probe = (
        f"import sys; sys.path.append({str(shim.parent)!r}); import crew_shim.reply; "
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", probe], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == ""


def test_the_wrapper_boots_without_importlib_util(tmp_path: Path) -> None:
    assert "importlib" not in crew_wrapper_script(sys.executable)
