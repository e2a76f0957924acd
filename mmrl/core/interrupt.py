"""Stop a run cleanly on SIGINT (Ctrl-C) or SIGTERM (a scheduler's kill): at the next step boundary,
with a checkpoint, so that ``--resume`` continues exactly where it stopped.

The handler only records the signal; the trainer's loop asks :func:`requested` after each step (all
processes agree through one reduction), saves a checkpoint and raises :class:`TrainingInterrupted`.
A second signal stops at once, the default way (the previous checkpoint stays; checkpoints are atomic).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_received: list[int] = []  # the signals received while :func:`stop_at_step_boundary` is active


class TrainingInterrupted(Exception):
    """The run stopped early on a signal, after saving a checkpoint of ``step``."""

    def __init__(self, step: int):
        self.step = step
        self.signum = _received[0] if _received else int(signal.SIGTERM)  # another process got it
        super().__init__(f"interrupted at step {step}, checkpoint saved; --resume to continue")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM


def requested() -> bool:
    return bool(_received)


def _handle(signum: int, frame) -> None:
    if _received:  # the second signal: stop now
        signal.signal(signum, signal.SIG_DFL)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        os.kill(os.getpid(), signum)
        return
    _received.append(signum)
    if os.environ.get("RANK", "0") == "0":
        print(f"mmrl: {signal.Signals(signum).name}: stopping after this step with a checkpoint "
              f"(again to stop at once)", file=sys.stderr, flush=True)


def die_with_launcher() -> None:
    """Under a launcher (``accelerate launch`` / ``torchrun`` set ``LOCAL_RANK``), have Linux send this worker
    SIGTERM when the launcher dies: killing the launcher then stops its workers at the next step boundary
    (with a checkpoint when they can still agree on it: the rendezvous store may have died with the
    launcher) instead of leaving them training in their own process groups until a collective times out."""
    if "LOCAL_RANK" not in os.environ or not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() == 1:  # the launcher died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


@contextlib.contextmanager
def stop_at_step_boundary() -> Iterator[None]:
    """While active, SIGINT / SIGTERM ask the trainer to stop at the next step boundary (also the SIGTERM a
    worker gets when its launcher dies)."""
    previous = {s: signal.signal(s, _handle) for s in SIGNALS}
    die_with_launcher()
    _received.clear()
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _received.clear()
