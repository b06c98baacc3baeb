"""`python -m services.cli.deathsig PPID CMD...`: run CMD so that it dies with its launcher.

Sets PR_SET_PDEATHSIG (kept across execve) and then execs CMD. Doing this in a wrapper,
instead of a subprocess `preexec_fn`, lets the launcher spawn without a plain fork(): a fork
runs gRPC's atfork handlers in the child, which can crash it before it ever execs.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main() -> int:
    expected_parent = int(sys.argv[1])
    cmd = sys.argv[2:]
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass  # not Linux: the launcher still stops its children on a clean exit
    if os.getppid() != expected_parent:
        return 1  # the launcher died before the signal was armed
    os.execvp(cmd[0], cmd)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
