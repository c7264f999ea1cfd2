"""The secret places of a home directory: never readable in any sandbox.

One list, used by the launcher (toolchain roots found on `PATH`, interpreter
directories, the user's `read_only_roots`) and by the Computer (refusing a bad
`read_only_roots` entry at bootstrap). A directory that is, contains or lies
inside one of these places, `$HOME` itself or the crew home (the Computer's
sockets and every agent's token) is never granted.
"""

from __future__ import annotations

from pathlib import Path

# Relative to $HOME. Credentials, keyrings, the user's own OpenCode login and
# config, and browser profiles (cookies and saved passwords).
SECRET_PLACES = (
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".kube",
    ".docker",
    ".netrc",
    ".git-credentials",
    ".npmrc",
    ".pypirc",
    ".vault-token",
    ".password-store",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".config/gh",
    ".config/gcloud",
    ".config/git/credentials",
    ".config/opencode",
    ".local/share/opencode",
    ".local/share/keyrings",
    ".pki",
    ".mozilla",
    ".thunderbird",
    ".config/google-chrome",
    ".config/chromium",
    ".config/BraveSoftware",
    ".config/microsoft-edge",
    ".var/app",  # Flatpak apps keep their own profiles and keyrings here
    "snap",  # … and snaps (snap/firefox, snap/chromium)
    "Library/Keychains",
    "Library/Cookies",
    "Library/Application Support/Google",
    "Library/Application Support/Firefox",
    "Library/Application Support/BraveSoftware",
    "Library/Application Support/Microsoft Edge",
    "Library/Safari",
)


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def secret_overlap(path: Path, home: Path, crew_home: Path) -> str | None:
    """Why `path` may never be readable in a sandbox, or None when it may.

    All three paths absolute and resolved. Refused: a path that contains
    `$HOME`, one that is, contains or lies inside the crew home, and one that
    is, contains or lies inside a `SECRET_PLACES` entry.
    """
    if _inside(home, path):
        return f"it contains $HOME ({home})"
    if _inside(crew_home, path) or _inside(path, crew_home):
        return f"it overlaps the crew home {crew_home} (the agents' tokens and sockets)"
    for place in SECRET_PLACES:
        secret = home / place
        if _inside(path, secret):
            return f"it lies inside the secret place {secret}"
        if _inside(secret, path):
            return f"it contains the secret place {secret}"
    return None
