"""Buckets stepped while backward goes on: optimizer.step_during_backward().

Each parameter's post-accumulate-grad hook copies its gradient into the worker's buffer (_layout.
Slot.watch); once every parameter of a bucket has landed, the hook queues the bucket and returns.
A driver thread submits the queue to the worker one bucket after another (zb_worker_submit_groups)
and waits for each with the GIL released, so the worker's cores step bucket after bucket while
backward computes the rest. The end of backward closes the stream (the thread ends once the
queue is empty, so the buckets step with backward's gradients); step() then steps what did not go
and brings the whole update into the model: the updated values stay in
the worker until every bucket is done, so the model sees the step whole or not at all.

A bucket of CUDA parameters goes back to the GPU as soon as the worker has stepped it
(_cuda.Gpu.early), its old values kept in its consumed gradient slots until step() has the
whole step; a failure puts them back (optim.AdamW._restore_early).

The update is element-wise, so the buckets' result is the whole step's to the bit. A decision over
every gradient (skip_nonfinite, max_grad_norm) cannot be made bucket by bucket: with either, and in
overlap mode, the hooks only copy, and step() steps everything at once."""

import collections
import threading

from ._native import ZenbindError


class Stream:
    """One backward's buckets: which have landed, which went to the worker, what they found.
    The worker handle is the driver thread's from the first bucket queued until close()."""

    def __init__(self, worker, layouts, k, grad_scale, flags, timeout_ms, gpu=None):
        self.worker = worker
        self.k = k
        self.grad_scale = grad_scale
        self.flags = flags
        self.timeout_ms = int(timeout_ms)
        self.gpu = gpu if gpu is not None and gpu.active else None
        self.left = {}       # worker group index -> slots still to land (streamable buckets)
        self.early = {}      # worker group index -> its slots, to go back once stepped
        self.landed = set()  # ids of the slots that landed
        for layout in layouts:
            for b, bucket in enumerate(layout.buckets if layout else ()):
                # a bucket the worker leaves partly idle waits for step(), which says again
                # which of its parameters are idle
                if all(s.streamable() for s in bucket) and not layout.idle(b):
                    self.left[bucket[0].group.index] = len(bucket)
                    if self.gpu is not None and all(s.can_go_early(k) for s in bucket):
                        self.early[bucket[0].group.index] = bucket
        self.queue = collections.deque()
        self.stepped = {}  # worker group indices submitted, in order (a dict keeps the order)
        self.events = {}   # worker group index -> CUDA event of its last gradient copy
        self.nonfinite, self.seconds, self.sum_squares = 0, 0.0, 0.0
        self.error = None  # the driver's failure, raised by close()
        self.stranded = False  # a bucket past its timeout, still in the worker's hands
        self.again = []  # indices of parameters whose gradient landed a second time
        self._cv = threading.Condition()
        self._closing = False
        self._thread = None

    def started(self):
        """Whether a bucket went (or is about to go) to the worker."""
        return self._thread is not None

    def land(self, slot):
        """A hook copied slot's gradient: queue its bucket if it was the last to land. (Hooks of
        CPU and of GPU parameters run on different autograd threads: one at a time here.)"""
        index = slot.group.index
        with self._cv:
            if index not in self.left or self._closing:
                return
            if id(slot) in self.landed:  # its bucket may be stepping: step() says so
                if slot.index not in self.again:
                    self.again.append(slot.index)
                return
            self.landed.add(id(slot))
            self.left[index] -= 1
            if slot.staged and slot.staged[3] is not None:
                # one copy stream, in order: the latest copy's event covers the bucket's earlier
                self.events[index] = slot.staged[3]
            if self.left[index]:
                return
            self.queue.append(index)
            if self._thread is None:
                self._thread = threading.Thread(target=self._drive, daemon=True,
                                                name="zenflow_bind buckets")
                self._thread.start()
            self._cv.notify()

    def _drive(self):
        while True:
            with self._cv:
                while not self.queue and not self._closing:
                    self._cv.wait()
                if not self.queue or self.error is not None:
                    return
                index = self.queue.popleft()
            try:
                event = self.events.get(index)
                if event is not None:  # its gradients are in host memory
                    import torch
                    with torch.cuda.device(self.gpu.device):
                        event.synchronize()
                self.worker.submit(0, grad_buffer=self.k, grad_scale=self.grad_scale,
                                   flags=self.flags, groups=range(index, index + 1))
                self.stepped[index] = None
                result = self.worker.wait_result(self.timeout_ms)
                bucket = self.early.get(index)
                if bucket is not None and event is not None:
                    self.gpu.early(bucket, self.k, event)  # marks the slots early
            except BaseException as e:  # noqa: B036 (this thread's end: close() raises it)
                with self._cv:
                    self.error = e
                    self.stranded = index in self.stepped and \
                        isinstance(e, ZenbindError) and e.status == "ETIMEDOUT"
                    self.queue.clear()
                return
            self.nonfinite += result.nonfinite
            self.seconds += result.seconds
            self.sum_squares += result.grad_norm ** 2

    def close(self):
        """No more buckets: wait for those queued (in 0.2 s joins) and give the worker handle
        back. Raises the driver's failure, if any."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        while self._thread is not None and self._thread.is_alive():
            self._thread.join(0.2)
        if self.error is not None:
            raise self.error
