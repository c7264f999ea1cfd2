"""Entry point of the Landlock helper: ``python -I -S landlock_exec.py --deny … -- CMD…``.

Deliberately tiny: Python compiles a script run as ``__main__`` from source
on every start, while a module comes from its cached bytecode. So this only
puts the package's parent on ``sys.path`` (``-I`` leaves the script's own
directory off it) and runs `sandbox_launcher.landlock` (the helper itself).
"""

import sys

if __name__ == "__main__":
    sys.path.append((__file__.rpartition("/")[0] or ".") + "/..")  # after the stdlib
    from sandbox_launcher.landlock import main

    sys.exit(main(sys.argv[1:]))
