"""The daemon: one process that leads, keeps deadlines, dispatches and settles.

Its parts, each in a module of its own (docs/design.md, "Inside the daemon"):

- :mod:`.leadership` — the single-writer lock: take it or stand by, keep it, fence claims;
- :mod:`.inventory` — the jobs in memory, refreshes, and which deadlines are armed;
- :mod:`.loop` — the one deciding task: deadlines, coalescer, admission, sleep;
- :mod:`.dispatch` — one admitted ticket: claim, call, settle;
- :mod:`.settlement` — results saved with the next deadline; held, flushed, spooled,
  replayed;
- :mod:`.policy` — one classification of every database failure;
- :mod:`.wakes` — NOTIFY payloads read as hints;
- :mod:`.wiring` — :class:`Daemon`, which builds the parts and runs their lifecycle.

Layering: the daemon imports the pure core, the value modules and the shell (store,
listener, spool, executors); nothing but :mod:`coordinator.service` imports the daemon.
"""

from .wiring import EXIT_CONFIG as EXIT_CONFIG
from .wiring import EXIT_FAILED as EXIT_FAILED
from .wiring import EXIT_HANGUP as EXIT_HANGUP
from .wiring import EXIT_LOST as EXIT_LOST
from .wiring import EXIT_OK as EXIT_OK
from .wiring import EXIT_SPOOLED as EXIT_SPOOLED
from .wiring import Daemon as Daemon
from .wiring import DaemonSettings as DaemonSettings
from .wiring import default_instance as default_instance

__all__ = [
    "EXIT_CONFIG",
    "EXIT_FAILED",
    "EXIT_HANGUP",
    "EXIT_LOST",
    "EXIT_OK",
    "EXIT_SPOOLED",
    "Daemon",
    "DaemonSettings",
    "default_instance",
]
