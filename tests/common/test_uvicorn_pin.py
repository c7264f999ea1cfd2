"""uvicorn internals we build on are still there: a new uvicorn fails here, loudly, not in production.

Three places use uvicorn beyond its public API:
- `crew_common.unix_socket.peer_checked_h11` subclasses `H11Protocol` and closes a
  refused connection before `H11Protocol.connection_made` runs;
- `computer_service.introspection.IntrospectionServer` sets `server.lifespan` and
  calls `startup`/`shutdown` itself (uvicorn's `serve` would take over the signals);
- `sandbox_launcher.server.LauncherServer` overrides `main_loop` (no 100 ms tick)
  and calls `on_tick` once.
pyproject.toml pins the uvicorn range these were checked against. To move the pin:
read these uvicorn functions in the new version, adjust our code, then the pin.
"""

from __future__ import annotations

import inspect
import re
import tomllib
from pathlib import Path

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def test_installed_uvicorn_is_inside_the_pinned_range() -> None:
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    [spec] = [d for d in deps if d.startswith("uvicorn")]
    low = re.search(r">=\s*([\d.]+)", spec)
    high = re.search(r"<\s*([\d.]+)", spec)
    assert low and high, f"pyproject.toml must pin uvicorn to a range (>=a,<b), not {spec!r}"
    installed = _version(uvicorn.__version__)
    assert _version(low.group(1)) <= installed < _version(high.group(1)), (
        f"uvicorn {uvicorn.__version__} is outside {spec!r}, the range our use of its "
        "internals was checked against (see this module's docstring)"
    )


def test_serve_runs_startup_main_loop_shutdown_with_a_lifespan_attribute() -> None:
    serve = inspect.getsource(uvicorn.Server._serve)
    for step in (
        "self.lifespan = config.lifespan_class(config)",
        "await self.startup(sockets=sockets)",
        "await self.main_loop()",
        "await self.shutdown(sockets=sockets)",
    ):
        assert step in serve, f"uvicorn.Server._serve no longer does {step!r}"
    assert "self.lifespan.startup()" in inspect.getsource(uvicorn.Server.startup)
    assert "self.lifespan.shutdown()" in inspect.getsource(uvicorn.Server.shutdown)
    config = uvicorn.Config(app=lambda *a: None, lifespan="off")
    config.load()
    assert callable(config.lifespan_class)


def test_main_loop_and_on_tick_keep_their_shape() -> None:
    assert list(inspect.signature(uvicorn.Server.main_loop).parameters) == ["self"]
    assert list(inspect.signature(uvicorn.Server.on_tick).parameters) == ["self", "counter"]
    assert inspect.iscoroutinefunction(uvicorn.Server.on_tick)
    assert list(inspect.signature(uvicorn.Server.handle_exit).parameters) == [
        "self",
        "sig",
        "frame",
    ]


def test_h11_protocol_can_refuse_before_connection_made() -> None:
    # A refused connection only gets `self.transport` set; connection_lost must cope.
    made = inspect.getsource(H11Protocol.connection_made)
    assert "self.connections.add(self)" in made and "self.flow = FlowControl" in made
    lost = inspect.getsource(H11Protocol.connection_lost)
    assert "if self.flow is not None" in lost, "connection_lost now needs self.flow set"
    assert "self.transport.close()" in lost
