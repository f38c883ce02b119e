"""`python -m workbench`: the `workbench` command line, runnable without the console script (the Jupyter
server starts capture jobs this way, with the server's own interpreter).

SIGINT stops the command as Ctrl-C does (nothing half-written is kept, exit code 130) even when the parent
process ignores SIGINT, as a server started in the background does: without this, Python would inherit the
ignored signal and a cancelled job could only be killed. The handler is set before the command line
loads, so a SIGINT while it loads is covered too (`workbench.interrupts`).
"""

import signal

if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from workbench.cli import main

    main()
