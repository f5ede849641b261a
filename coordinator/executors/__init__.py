"""Executors: how a claimed run is called (docs/design.md, "Executors").

An executor is part of the shell: it does I/O (subprocesses, sockets) and never raises
for anything the job does; whatever happens becomes an :class:`~coordinator.model.Outcome`.
Only ``trio.Cancelled`` may propagate, after the executor has stopped what it started.

:class:`Executor` (in :mod:`.base`) is the whole contract the daemon relies on: it never
asks an executor what it can do. Layering: executors import value modules (model,
events, status, protocol, text) and never the daemon or the store.
"""

from .base import Executor as Executor
from .base import ExecutorHooks as ExecutorHooks
from .exec import ExecExecutor as ExecExecutor

__all__ = ["ExecExecutor", "Executor", "ExecutorHooks"]
