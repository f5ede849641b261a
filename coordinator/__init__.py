"""coordinator: an idle-silent deadline coordinator for jobs kept in PostgreSQL.

What applications use is re-exported here: the value types, the SQL-API client module,
the worker SDK and the error hierarchy. Everything else lives in private-by-convention
modules whose names say what they hold.

The exports are lazy (PEP 562): ``import coordinator.worker`` — a worker process —
loads the SDK and the protocol only, not asyncpg, trio-asyncio or croniter, which the
client and the schedules need. Layering is written down in docs/design.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import client as client
    from .errors import ConfigError as ConfigError
    from .errors import Conflict as Conflict
    from .errors import CoordinatorError as CoordinatorError
    from .errors import DatabaseError as DatabaseError
    from .errors import DatabaseUnavailable as DatabaseUnavailable
    from .errors import InvalidInput as InvalidInput
    from .errors import InvalidSchedule as InvalidSchedule
    from .errors import JobNotFound as JobNotFound
    from .errors import RunNotFound as RunNotFound
    from .model import Job as Job
    from .model import Outcome as Outcome
    from .model import Schedule as Schedule
    from .model import Target as Target
    from .worker import Context as Context
    from .worker import Worker as Worker

__version__ = "0.1.0"

#: name -> the module it lives in.
_EXPORTS: dict[str, str] = {
    "client": ".client",
    "ConfigError": ".errors",
    "Conflict": ".errors",
    "CoordinatorError": ".errors",
    "DatabaseError": ".errors",
    "DatabaseUnavailable": ".errors",
    "InvalidInput": ".errors",
    "InvalidSchedule": ".errors",
    "JobNotFound": ".errors",
    "RunNotFound": ".errors",
    "Job": ".model",
    "Outcome": ".model",
    "Schedule": ".model",
    "Target": ".model",
    "Context": ".worker",
    "Worker": ".worker",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'coordinator' has no attribute {name!r}")
    loaded = importlib.import_module(module, __name__)
    value = loaded if name == "client" else getattr(loaded, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "ConfigError",
    "Conflict",
    "Context",
    "CoordinatorError",
    "DatabaseError",
    "DatabaseUnavailable",
    "InvalidInput",
    "InvalidSchedule",
    "Job",
    "JobNotFound",
    "Outcome",
    "RunNotFound",
    "Schedule",
    "Target",
    "Worker",
    "__version__",
    "client",
]
