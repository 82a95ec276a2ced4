"""The signals that stop a job (Ctrl-C's SIGINT; Slurm's SIGTERM at scancel, the time limit or
preemption; sbatch --signal's USR1) around the few places where a handler that raises would leave
the optimizer and its worker disagreeing (a step submitted but not recorded, a result taken but
not applied): inside the block they are held back, and when it ends the handlers that were
installed get them, each one, in the order they came; the first exception a handler raises is
raised after all have run."""

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
    previous = {}  # signal -> its handler, for those held here
    caught = {}  # signal -> the frame it came in (one each: a signal pending twice is once)
    done = []  # set once the block is over: a hold still in place then delivers at once

    def hold(signum, frame):
        if done:
            return previous[signum](signum, frame)
        caught.setdefault(signum, frame)
        return None

    # signal.signal() first runs the Python handlers of signals already pending, which may raise:
    # whatever was swapped is put back whatever raises, and every held signal is delivered.
    first = None
    try:
        for s in JOB_SIGNALS:
            handler = signal.getsignal(s)
            if callable(handler):
                previous[s] = handler  # first: put back whatever raises from here on
                signal.signal(s, hold)
        yield
    finally:
        done.append(True)
        for s, handler in previous.items():
            try:
                signal.signal(s, handler)
            except BaseException as e:  # noqa: B036 (a pending handler's: raised below)
                first = e if first is None else first
        for s, frame in list(caught.items()):
            try:
                previous[s](s, frame)  # Python's SIGINT handler raises KeyboardInterrupt
            except BaseException as e:  # noqa: B036 (raised below, the first one)
                first = e if first is None else first
        if first is not None:
            raise first
