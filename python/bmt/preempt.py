"""bmt.preempt — SIGUSR1 becomes "save at the next step boundary, then exit 0".

Slurm sends SIGUSR1 before the time limit (bmlaunch --sbatch writes
--signal=B:USR1@120) and bmlaunch forwards it to every rank, each seeing it at
its own moment, or one rank may get it alone (kill -USR1 PID). As in the GPT-2
trainer (examples/gpt2/train.c), the handler only sets a flag; at each step
boundary every rank takes the maximum of the flags over the world (one
all_reduce of one number on torch.distributed's default group), so either all
ranks stop after the same step or none does. Then the save callback runs on
every rank, a checkpoint_saved event goes to the collector, and the process
exits 0 (atexit handlers run: the metrics are flushed).

    with bmt.Preemption(save=lambda step: save_checkpoint(step)) as pre:
        for step in range(first, steps + 1):
            train_one_step()
            pre.step_boundary(step)   # every rank, every step
"""

import os
import signal
import sys

__all__ = ["Preemption"]


def _pending_signals(env):
    """The signals of BMT_PENDING_SIGNALS (USR1, USR2 or USR1,USR2), which
    bmlaunch sets in a restarted job's ranks when they came before this run."""
    v = env.get("BMT_PENDING_SIGNALS")
    if v is None:
        return set()
    names = v.split(",")
    if not v or any(n not in ("USR1", "USR2") for n in names) or len(set(names)) != len(names):
        raise ValueError("BMT_PENDING_SIGNALS='%.200s' is not USR1, USR2 or USR1,USR2 "
                         "(bmlaunch sets it)" % v)
    return {getattr(signal, "SIG" + n) for n in names}


class Preemption:
    """Turns a signal (default SIGUSR1) into an agreed save-and-exit.

    save: called as save(step) on every rank when the ranks agree to stop; its
    return value, when a string, is the checkpoint's path for the
    checkpoint_saved event. None: nothing is saved, the ranks just exit 0.
    group: the process group to agree over (default: the world).
    exit: False makes step_boundary return True instead of exiting.
    The handler is installed at construction (the default action of SIGUSR1
    ends the process) and the previous one put back by close or the end of a
    with block. A signal that BMT_PENDING_SIGNALS names (it came to bmlaunch
    before this run of a restarted job) counts as received at construction."""

    def __init__(self, save=None, signum=signal.SIGUSR1, group=None, exit=True):
        self.save, self.signum, self.group, self.exit = save, signum, group, exit
        self.stopped_at = None
        # A restarted job's warning that came to bmlaunch before this run
        # (BMT_PENDING_SIGNALS, as libbmt's bmt_init raises it); read before
        # the handler goes in, so that a malformed one changes nothing
        self.requested = signum in _pending_signals(os.environ)  # this rank got the signal
        self._previous = signal.signal(signum, self._handler)

    def _handler(self, signum, frame):
        self.requested = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        if self._previous is not None:
            signal.signal(self.signum, self._previous)
            self._previous = None

    def agreed(self):
        """Whether any rank got the signal: a collective when torch.distributed
        is initialized (every rank must call it at the same boundary)."""
        flag = 1 if self.requested else 0
        dist = None
        if "torch" in sys.modules:
            import torch.distributed as dist
            if not (dist.is_available() and dist.is_initialized()):
                dist = None
        if dist is None:
            return bool(flag)
        import torch
        backend = str(dist.get_backend(self.group))
        device = "cuda" if "nccl" in backend and "gloo" not in backend else "cpu"
        if device == "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
        t = torch.tensor([flag], dtype=torch.int32, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return bool(t.item())

    def step_boundary(self, step):
        """Call after every step on every rank. When a rank got the signal:
        save(step) on every rank, then exit 0 (or return True with exit=False)."""
        if not self.agreed():
            return False
        self.stopped_at = step
        path = self.save(step) if self.save is not None else None
        from . import metrics
        if self.save is not None:
            metrics.report_event("checkpoint_saved", path if isinstance(path, str) else
                                 "step %d" % step)
        metrics.report_event("note", "SIGUSR1: stopped after step %d" % step
                             if self.signum == signal.SIGUSR1 else
                             "signal %d: stopped after step %d" % (self.signum, step))
        if not self.exit:
            return True
        self.close()
        sys.exit(0)
