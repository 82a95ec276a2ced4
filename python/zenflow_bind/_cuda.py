"""The GPU side of zenflow_bind.optim.AdamW, for parameters on a CUDA device.

- The worker's shared buffers are registered as pinned host memory (cudaHostRegister) while the
  optimizer lives, so the copies between them and the GPU are DMA and can be asynchronous.
- A gradient leaves the GPU as soon as backward has accumulated it: the post-accumulate-grad hook
  (_layout.Slot.watch) queues its copy on a copy stream, after the work that produced it, and
  backward goes on; an event says when it has landed, and the worker reads nothing before it.
- The updated parameters go back on a second stream, parameter by parameter, straight into their
  storage (no staging tensor on the GPU for a parameter of the gradient's dtype); the caller's
  stream waits for them before the next forward, the host does not, and the worker writes nothing
  the copies read before they are done (settle()).
- A bucket stepped during backward goes back at once (early()), while the worker steps the next
  ones: first its old values into its gradient slots, which the step has consumed, then its new
  ones. If a later bucket fails, restore() puts the old values back: the model sees the step
  whole or not at all, and the copies cost one more transfer each way, hidden behind the step.

Nothing here touches torch.cuda before a group with a CUDA parameter is adopted."""

import os
import threading

import torch

from ._layout import local

_PORTABLE = 1  # cudaHostRegisterPortable: pinned for every CUDA context of the process


def on_cuda(param):
    return local(param).device.type == "cuda"


class Gpu:
    """One optimizer's pinned buffers and copy streams (inactive without CUDA parameters)."""

    def __init__(self):
        self.device = None
        self.pinned = []       # addresses registered with CUDA
        self.out = None        # stream: gradients to the host
        self.back = None       # stream: parameters to the GPU
        self.back_done = None  # True while copies are queued, then their event, until settle()
        self.after_use = False  # the back stream waited for the caller's since the last publish
        self.lock = threading.Lock()  # a hook's gradient copy against a bucket going back
        self.pid = os.getpid()  # a forked child neither waits for nor unpins its parent's

    @property
    def active(self):
        return self.device is not None

    def adopt(self, layout):
        """Pin a param group's worker buffers if it holds a CUDA parameter (one device per
        optimizer: one rank, one GPU)."""
        devices = {local(s.param).device for s in layout.slots if on_cuda(s.param)}
        if not devices:
            return
        if len(devices | ({self.device} if self.device else set())) > 1:
            raise ValueError(f"parameters on {sorted(map(str, devices))} and {self.device}: one "
                             "zenflow_bind.optim.AdamW optimizes the parameters of one GPU")
        if self.device is None:
            self.device = devices.pop()
            self.out = torch.cuda.Stream(device=self.device)
            self.back = torch.cuda.Stream(device=self.device)
        cudart = torch.cuda.cudart()
        for group in layout.group.groups:
            for array in (group.params, *group.grads, group.copy_out):
                if array is None or array.nbytes == 0 or array.ctypes.data in self.pinned:
                    continue  # (pinned already: a layout adopted again after a move)
                address = array.ctypes.data
                with torch.cuda.device(self.device):  # not a context on GPU 0
                    err = int(cudart.cudaHostRegister(address, array.nbytes, _PORTABLE))
                if err != 0:
                    raise RuntimeError(f"cudaHostRegister of {array.nbytes} bytes of the "
                                       f"worker's shared memory failed (cudaError {err})")
                self.pinned.append(address)

    def forget(self, layout):
        """Unpin what adopt() pinned of a param group's buffers, before its worker groups go."""
        if not self.pinned or os.getpid() != self.pid:
            return
        mine = {array.ctypes.data for group in layout.group.groups
                for array in (group.params, *group.grads, group.copy_out)
                if array is not None and array.nbytes}
        cudart = torch.cuda.cudart()
        with torch.cuda.device(self.device):
            for address in [a for a in self.pinned if a in mine]:
                cudart.cudaHostUnregister(address)
                self.pinned.remove(address)

    def grad_out(self, grad, dst, unless_early=None):
        """Queue grad's copy into pinned dst after the work that produced it; its event. None,
        and no copy, if the slot unless_early went back early (checked under the lock early()
        marks it under, so no copy can slip in after its old values were saved)."""
        with self.lock:
            if unless_early is not None and unless_early.early is not None:
                return None
            self.out.wait_stream(torch.cuda.current_stream(grad.device))
            with torch.cuda.stream(self.out):
                dst.copy_(grad, non_blocking=True)
            grad.record_stream(self.out)  # freed early (zero_grad): the memory waits the copy
            event = torch.cuda.Event()
            event.record(self.out)
            return event

    def grads_landed(self):
        """Every gradient copy queued so far is in host memory."""
        if self.active:
            self.out.synchronize()

    def param_back(self, param, src):
        """Queue the copy of src (pinned, on the host) into param's storage, after the model's
        last use so far."""
        if not self.after_use:  # the first of a step()
            self.back.wait_stream(torch.cuda.current_stream(self.device))
            self.after_use = True
        with torch.cuda.stream(self.back):
            param.copy_(src, non_blocking=True)
        self.back_done = True

    def early(self, slots, k, after):
        """A bucket stepped during backward: queue its old values into its gradient slots in
        buffer k, then its new ones into the parameters, after the event `after` of its last
        gradient copy (which followed backward's last use of them). From the driver thread."""
        with self.lock, torch.cuda.device(self.device), torch.cuda.stream(self.back), \
                torch.no_grad():
            for s in slots:
                s.early = k  # from now on a hook copies nothing into its slot
            self.back.wait_event(after)
            for s in slots:
                s.grads[k].copy_(local(s.param), non_blocking=True)
            for s in slots:
                local(s.param).copy_(s.copy if s.copy is not None else s.master,
                                     non_blocking=True)
        self.back_done = True

    def restore(self, slots, k):
        """Put back the old values early() saved, after whatever the caller's stream has queued,
        and have it wait for them."""
        with torch.cuda.device(self.device), torch.cuda.stream(self.back), torch.no_grad():
            self.back.wait_stream(torch.cuda.current_stream(self.device))
            for s in slots:
                local(s.param).copy_(s.grads[k], non_blocking=True)
        self.back_done = True
        self.publish()

    def publish(self):
        """A step's copies are queued: the caller's stream (the next forward) waits for them."""
        self.after_use = False
        if self.back_done is True:
            event = torch.cuda.Event()
            event.record(self.back)
            torch.cuda.current_stream(self.device).wait_event(event)
            self.back_done = event

    def settle(self):
        """Before the worker or this process writes the shared buffers again: the copies that
        read them are done."""
        done, self.back_done = self.back_done, None
        self.after_use = False
        if done is True:
            self.back.synchronize()
        elif done is not None:
            done.synchronize()

    def release(self):
        """Unpin, before the worker's buffers are unmapped, once no copy touches them."""
        if not self.pinned or os.getpid() != self.pid:
            return
        with torch.cuda.device(self.device):
            self.out.synchronize()  # gradient copies of a backward no step() followed
            self.settle()
            cudart = torch.cuda.cudart()
            for address in self.pinned:
                cudart.cudaHostUnregister(address)
        self.pinned = []
