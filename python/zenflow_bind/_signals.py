"""The signals that stop a job (Ctrl-C's SIGINT; Slurm's SIGTERM at scancel, the time limit or
preemption; sbatch --signal's USR1) around the few places where a handler that raises would leave
the optimizer and its worker disagreeing (a step submitted but not recorded, a result taken but
not applied): inside the block they are held back, and when it ends the handlers that were
installed get them, in the order they came."""

import contextlib
import signal
import threading

# The zenflow-optimizer worker ignores the same ones (it goes when the trainer does).
JOB_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


@contextlib.contextmanager
def deferred_interrupts():
    # Python runs signal handlers in the main thread only; a handler that is not Python's
    # (SIG_IGN, SIG_DFL, one set from C) is left alone.
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in JOB_SIGNALS}
    previous = {s: h for s, h in previous.items() if callable(h)}
    caught = {}  # signal -> the frame it came in (one each: a signal pending twice is once)

    def hold(signum, frame):
        caught.setdefault(signum, frame)

    for s in previous:
        signal.signal(s, hold)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        held = list(caught.items())
        for i, (s, frame) in enumerate(held):
            try:
                previous[s](s, frame)  # Python's SIGINT handler raises KeyboardInterrupt
            except BaseException:
                for later, _ in held[i + 1:]:
                    signal.raise_signal(later)  # handled as soon as this exception is
                raise
