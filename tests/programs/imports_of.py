"""Import each module named on the command line; print what it resolved to, or the error."""

import sys

for name in sys.argv[1:]:
    try:
        module = __import__(name, fromlist=["_"])
    except Exception as exc:  # the test reads the error
        print(f"{name}: {type(exc).__name__}: {exc}")
    else:
        print(f"{name}: {module.__name__}")
