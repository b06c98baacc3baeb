"""Run by tests/cli/test_forkserver.py through the fork server: prints what a child sees
(its environment variable, working directory, argv) and then sleeps or exits as told."""

import os
import signal
import sys
import time

inherited = "PATH" in os.environ  # set in every test process, never passed here
probe = os.environ.get("FORKED_PROBE")
# As in a fresh interpreter: SIGPIPE ignored (a write to a closed socket raises).
pipe_ignored = signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN
print(f"seen {probe} {os.getcwd()} {sys.argv[0]} {os.getsid(0)} {inherited} {pipe_ignored}")
sys.stdout.flush()
action = os.environ.get("FORKED_ACTION", "sleep")
if action.startswith("exit"):
    sys.exit(int(action[4:]))
if action == "raise":
    raise RuntimeError("the child failed")
time.sleep(600)
