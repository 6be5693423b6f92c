"""A stack sampler in every Python process (for call 4): where each thread spends its time.

Imported at start-up by every interpreter whose PYTHONPATH holds this folder. When
MINI_STACKS names a folder, a daemon thread samples every other thread's stack every
MINI_STACKS_MS milliseconds and rewrites <folder>/<pid>.txt every two seconds with the
collapsed stacks and their sample counts (the first line: the process's command line).
"""
import os
import sys
import threading
import time
from collections import Counter

_out = os.environ.get("MINI_STACKS")


def _name(frame):
    code = frame.f_code
    return f"{os.path.basename(code.co_filename)}:{code.co_name}"


def _run(folder, period):
    counts = Counter()
    me = threading.get_ident()
    path = os.path.join(folder, f"{os.getpid()}.txt")
    last = time.monotonic()
    while True:
        time.sleep(period)
        names = {t.ident: t.name for t in threading.enumerate()}
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            stack = []
            while frame is not None and len(stack) < 40:
                stack.append(_name(frame))
                frame = frame.f_back
            counts[names.get(ident, "?") + ";" + ";".join(reversed(stack))] += 1
        if time.monotonic() - last > 2.0:
            last = time.monotonic()
            with open(path + ".tmp", "w") as f:
                f.write(" ".join(sys.argv)[:300] + "\n")
                for stack, n in counts.most_common():
                    f.write(f"{n} {stack}\n")
            os.replace(path + ".tmp", path)


if _out:
    os.makedirs(_out, exist_ok=True)
    threading.Thread(
        target=_run, args=(_out, float(os.environ.get("MINI_STACKS_MS", "5")) / 1000), daemon=True
    ).start()
