"""A module the pod launcher's tests start as a pod: it reports what it was given, registers an
exit handler, then exits with the code asked for or sleeps until signalled."""

import atexit
import os
import sys
import time

if __name__ == "__main__":
    print(f"argv={sys.argv[1:]} env={sorted(os.environ)} cores={sorted(os.sched_getaffinity(0))}",
          flush=True)
    atexit.register(print, "exit handler ran", flush=True)
    if sys.argv[1] == "sleep":
        time.sleep(120)
    sys.exit(int(sys.argv[1]))
