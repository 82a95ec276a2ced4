"""Ctrl-C around the few places where an interrupt would leave the optimizer and its worker
disagreeing (a step submitted but not recorded, a result taken but not applied): SIGINT is held
back inside the block and handed to the handler that was installed when the block ends."""

import contextlib
import signal
import threading


@contextlib.contextmanager
def deferred_interrupts():
    previous = signal.getsignal(signal.SIGINT)
    # Python runs signal handlers in the main thread only; a handler that is not Python's
    # (SIG_IGN, SIG_DFL, one set from C) is left alone.
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield
        return
    frames = []
    signal.signal(signal.SIGINT, lambda signum, frame: frames.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if frames:
            previous(signal.SIGINT, frames[0])  # Python's default raises KeyboardInterrupt
