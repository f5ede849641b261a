"""Every SQL statement the daemon sends, and nothing else.

The daemon's budget is small and fixed: one statement to read the inventory (one per
:data:`REFRESH_PAGE` jobs beyond that; plus, only when there is something to write, one
batched statement per 25,000 missing deadlines to initialise them — and a second only if
some were changed meanwhile — and one to mark unusable schedules), one to claim a run, one
to settle it. Claim,
settlement and the crash sweep are SQL functions (``migrations/0002``) so that each is a
single round trip and a single line in the server's statement log.

All connections are the daemon's (``application_name = coordinator``, marked so the
wake triggers skip them). asyncpg errors are wrapped here, once, into three kinds the
daemon's error policy (:mod:`coordinator.daemon.policy`) acts on: connection trouble
becomes :class:`StoreUnavailable` (retry with backoff), a deadlock or serialization
failure :class:`StoreConflict` (retry at once), anything else the database refused
:class:`~coordinator.errors.DatabaseError`. Every statement sent is counted
(:attr:`Store.statements`, exported as ``coordinator_sql_statements_total``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar, cast

import asyncpg
import attrs
import trio
from asyncpg import Connection

from .core.admission import Ticket
from .db import APP_DAEMON, aio, aio_here, close_quietly, connect, one_line
from .errors import CoordinatorError, DatabaseError, DatabaseUnavailable
from .model import CheckpointWrite, Claim, Cursor, Schedule
from .rows import job_from_row, json_object, json_text, json_value
from .spool import HeldResult

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from asyncpg import Record


#: Where the refresh's deadlines count their microseconds from.
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)

#: Most rows one statement of a full refresh reads.
REFRESH_PAGE: Final = 50_000

#: Extra seconds a statement may take per million rows it reads or writes.
SECONDS_PER_MILLION_ROWS: Final = 120.0

#: The single-writer advisory lock: pg_advisory_lock(LOCK_CLASS, LOCK_OBJECT). Its
#: *fence* is the transaction-level advisory lock (LOCK_CLASS, LOCK_OBJECT + 1), which the
#: SQL functions derive (migrations/0018): every fenced claim holds it shared until it
#: commits, the crash sweep takes it exclusively first. Use neither key for anything else.
LOCK_CLASS: Final = 0x636F6F72  # "coor"
LOCK_OBJECT: Final = 1


class StoreUnavailable(DatabaseUnavailable):
    """The database could not be reached for this statement; the caller may retry."""


class StoreConflict(DatabaseError):
    """A deadlock or serialization failure: nothing was written; retry at once."""


#: SQLSTATEs of :class:`StoreConflict`: serialization_failure, deadlock_detected.
_CONFLICT_STATES: Final = frozenset({"40001", "40P01"})
#: SQLSTATE classes that mean the session or the server went away (08: connection
#: exception; 57: operator intervention — admin/crash shutdown, cannot connect now).
_UNAVAILABLE_CLASSES: Final = frozenset({"08", "57"})
#: SQLSTATEs that mean the server takes no writes now: read_only_sql_transaction (a
#: standby, or ``default_transaction_read_only``): waited out like a server away, not a
#: refusal of what was sent (a tester's spooled result was set aside as rejected, and
#: again at every start's attempt while the database stayed read-only).
_UNAVAILABLE_STATES: Final = frozenset({"25006"})


_TRANSIENT = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.ConnectionDoesNotExistError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.TooManyConnectionsError,
    asyncpg.PostgresConnectionError,
    asyncpg.QueryCanceledError,
)


@attrs.define(eq=False)
class JobEntry:
    """What the daemon keeps in memory about one job that may need a timer or a dispatch.

    Manual-only jobs without a queued run, paused jobs and invalid jobs are not loaded.
    The daemon's inventory owns these records and updates them in place (a settlement's
    new deadline, a first deadline saved at start): at a million jobs, a copy per update
    is most of a cold start's time. Positional arguments are allowed (the refresh
    builds a million with them: keywords cost twice as much); elsewhere, pass keywords.
    """

    #: Primary key.
    id: int
    #: ``namespace/name``, for logs.
    key: str
    #: The schedule as stored (``expression`` unvalidated).
    schedule: Schedule
    #: ``interactive`` or ``background``.
    priority: str
    #: The worker type for worker targets, ``None`` for commands.
    worker_type: str | None
    #: The saved deadline.
    next_run_at: datetime | None
    #: As stored; claims are checked against it.
    schedule_version: int
    #: The job's outstanding run, if any: id, status, created, claiming instance.
    run_id: int | None = None
    run_status: str | None = None
    run_created_at: datetime | None = None
    #: When a queued run may start (a retry's saved due time); ``None``: at once.
    run_due_at: datetime | None = None

    def armed_at(self) -> datetime | None:
        """The saved time the job's timer is armed on: a queued retry's due time while one
        waits, else the saved deadline when no run is outstanding or the outstanding run
        is paused (the tick resumes it), else none."""
        if self.run_id is not None and self.run_status != "paused":
            return self.run_due_at if self.run_status == "queued" else None
        return self.next_run_at

    @property
    def namespace(self) -> str:
        """The job's namespace: the key's first part (a namespace has no ``/``: the SQL
        API and every front door refuse one)."""
        return self.key.partition("/")[0]

    @property
    def retry_waiting(self) -> bool:
        """A queued run with a due time (a retry) is what the job's timer serves."""
        return self.run_status == "queued" and self.run_due_at is not None


@attrs.define(eq=False)
class FirstDeadlines:
    """First deadlines to save for one page of a refresh (:meth:`Store.init_deadlines`):
    parallel lists, one item per job, filled by the inventory a job at a time (a
    million on a first start: no object per job)."""

    #: Job ids.
    ids: list[int] = attrs.field(factory=list)
    #: The first deadline of each.
    ats: list[datetime] = attrs.field(factory=list)
    #: The schedule version each was computed for (a job edited since is not written).
    versions: list[int] = attrs.field(factory=list)


@attrs.frozen(kw_only=True)
class ClaimResult:
    """A granted claim (``claim``) or the reason it was refused."""

    claim: Claim | None = None
    #: ``None`` when granted; see ``coordinator._claim`` for the refusal reasons.
    reason: str | None = None
    #: Set when the claim was granted but the stored target cannot be called (the run
    #: must then fail without calling anything).
    target_error: str | None = None
    #: A granted claim's (batch number, rank among the claims its batch granted, how
    #: many it granted): claims granted together start their calls in rank order (the
    #: dispatcher's turnstile). Refusals take no place.
    place: tuple[int, int, int] = (0, 0, 1)
    #: With reason ``misfire``: the deadline skipped, and the one saved in its place.
    skipped: datetime | None = None
    next_run_at: datetime | None = None


@attrs.frozen(kw_only=True)
class JobState:
    """The job's deadline state right after a settlement, so it can be re-armed at once."""

    #: ``saved`` | ``already`` (saved before: a retry or replay) | ``gone`` (job removed)
    #: | ``paused`` (a give-back of a run an operator paused meanwhile: migrations/0025)
    #: | ``late`` (saved over the ``unresolved`` mark of another daemon's sweep) |
    #: ``superseded`` (the run was ended otherwise meanwhile: not saved; migrations/0032).
    outcome: str
    job_id: int | None = None
    paused: bool = False
    invalid: bool = False
    schedule_version: int | None = None
    next_run_at: datetime | None = None
    #: The run that retries this one, queued until its due time (``None``: no retry).
    retry_run_id: int | None = None
    retry_due_at: datetime | None = None
    #: This run failed on the job's last allowed attempt.
    exhausted: bool = False
    #: The category saved (``None`` for a success).
    category: str | None = None


@attrs.frozen(kw_only=True)
class AlertWindow:
    """What ``coordinator._alert_open`` answered for one (job, kind)."""

    #: ``due`` (send it: the window was opened now), ``inside`` (one went out less than
    #: a window ago), ``opted_out`` (the job says ``alert = false``), ``gone`` (removed).
    outcome: str
    #: The job's namespace and name (``None`` when gone).
    namespace: str | None = None
    name: str | None = None
    #: When the current window ends (due, inside).
    until: datetime | None = None
    #: When the alert before this one was sent, and how many were suppressed since (due).
    previous: datetime | None = None
    suppressed: int = 0


@attrs.frozen(kw_only=True)
class PruneBatch:
    """What one batch of the retention prune did, and where the next one starts."""

    deleted: int
    #: Removed jobs deleted with their last run.
    removed_jobs: int
    #: Jobs looked at.
    jobs_seen: int
    #: ``(job id, after run id)`` of the next batch; ``None`` when the prune is done.
    resume: tuple[int, int] | None


@attrs.frozen(kw_only=True)
class Declared:
    """What syncing a worker's declaration did."""

    created: int
    updated: int
    paused: int
    #: Nothing differed: nothing was written.
    unchanged: bool


@attrs.frozen(kw_only=True)
class LostRun:
    """A run found pending/running at startup: a previous daemon died during it."""

    run_id: int
    job_id: int
    #: ``unresolved``, ``retried`` or (a recoverable run) ``paused``.
    action: str
    #: Which attempt of its chain it was (1: the first).
    attempt: int | None = None
    #: The job's ``namespace/name`` (for its log line and per-job metrics).
    job: str | None = None


# A job without a saved deadline also says when it was last defined (``updated_at``: its
# first deadline counts from then, not from the refresh that reads it; see
# inventory._Firsts). The saved deadline comes as integer microseconds since the epoch
# (exact): decoding a million timestamps into datetimes costs the daemon more than
# reading the rows (about 1.8 us each against 0.4 us for an integer, measured), and jobs
# share deadlines, so each distinct one becomes a datetime once (_Shared.entries).
# A paused or invalid job (not a removed one, which is paused too and keeps its history)
# is read only while an unresolved run blocks it (``parked``):
# not loaded, only counted, since that run waits for an operator whatever the job's
# state (coordinator_unresolved_jobs).
_REFRESH = """
SELECT j.id, j.namespace || '/' || j.name AS key,
       j.schedule_kind, j.schedule, j.timezone, j.priority,
       CASE WHEN j.target->>'kind' = 'worker' THEN j.target->>'type' END AS worker_type,
       (extract(epoch FROM j.next_run_at) * 1000000)::bigint AS next_run_us,
       j.schedule_version,
       r.id AS run_id, r.status AS run_status, r.created_at AS run_created_at,
       r.due_at AS run_due_at,
       CASE WHEN j.next_run_at IS NULL
            THEN (extract(epoch FROM j.updated_at) * 1000000)::bigint END AS defined_us,
       j.paused OR j.invalid_reason IS NOT NULL AS parked
  FROM coordinator.jobs j
  LEFT JOIN coordinator.runs r
         ON r.job_id = j.id
        AND r.status IN ('queued', 'pending', 'running', 'unresolved', 'cancel_requested',
                         'paused')
 WHERE (NOT j.paused AND j.invalid_reason IS NULL
        AND (j.schedule_kind IN ('cron', 'interval') OR j.next_run_at IS NOT NULL
             OR (r.id IS NOT NULL AND r.status <> 'paused'))
        OR (r.status = 'unresolved' AND j.removed_at IS NULL))
"""

# A full refresh reads the table a page at a time, in id order (the primary key's
# index): the rows of one page are turned into entries and dropped before the next page
# is read, so a million asyncpg records never live at once, and the first deadlines of
# one page are written while the next one is read.
_REFRESH_PAGE = _REFRESH + "   AND j.id > $1\n ORDER BY j.id\n LIMIT $2\n"

# The same, for the jobs a wake named (an incremental refresh). The ids arrive as text
# ('{1,2,3}') cast in SQL: no array codec, no type lookup.
_REFRESH_SOME = _REFRESH + "   AND j.id = ANY ($1::text::bigint[])\n"

# Batches arrive as text parameters cast in SQL (JSON, or array literals): array
# parameters would make asyncpg look up their types with extra statements the first time
# each connection uses them.
#
# First deadlines: a batch of one page of a refresh per statement (at most
# inventory.FIRST_DEADLINE_BATCH jobs). Locks each row it writes, and never overwrites a
# deadline that a settlement (or an application) wrote meanwhile, nor one for a schedule
# that has changed since it was read. Parallel arrays written as text ('{1,2,3}'),
# several times cheaper to build and to parse than JSON objects at a million jobs: ids,
# schedule versions, and for each job the position of its deadline in $4, the batch's
# distinct deadlines (jobs share schedules, so a batch has few: parsing a timestamp costs
# the server far more than an integer; the scalar subquery is an InitPlan, parsed once
# per statement whatever the join order). The arrays are unnested in a select list
# (streamed, where unnest in FROM would first copy every row into a tuple store). The
# range of the batch's ids ($5, $6) lets the planner reach the rows by the primary key
# instead of reading the whole table: a hash join over that range (50,000 rows hashed in
# about 50 ms; a merge join sorts the batch and is no faster), or, once the plan is
# generic, a nested loop on the primary key. Its answer is the count written: when it is
# every job sent (normally), the daemon arms them with the deadlines it sent, so a
# million rows are never read back.
_INIT_DEADLINES = """
UPDATE coordinator.jobs j
   SET next_run_at = (SELECT $4::text::timestamptz[])[v.k], updated_at = now()
  FROM (SELECT unnest($1::text::bigint[]) AS id, unnest($2::text::integer[]) AS version,
               unnest($3::text::integer[]) AS k) AS v
 WHERE j.id = v.id AND j.schedule_version = v.version AND j.next_run_at IS NULL
   AND j.id BETWEEN $5 AND $6
"""

# Only when the count fell short: the jobs of the same batch whose saved state is not what
# was sent (changed, or removed, meanwhile). A deadline written and then changed again
# before this looks is counted as not written: its writer's wake brings it back.
_REFUSED_DEADLINES = """
SELECT v.id
  FROM (SELECT unnest($1::text::bigint[]) AS id, unnest($2::text::integer[]) AS version,
               unnest($3::text::integer[]) AS k) AS v
  LEFT JOIN coordinator.jobs j ON j.id = v.id AND j.id BETWEEN $5 AND $6
 WHERE j.id IS NULL OR j.schedule_version <> v.version
    OR j.next_run_at IS DISTINCT FROM (SELECT $4::text::timestamptz[])[v.k]
"""

_MARK_INVALID = """
UPDATE coordinator.jobs j
   SET invalid_reason = v.reason, next_run_at = NULL, updated_at = now()
  FROM json_to_recordset($1::text::json) AS v(id bigint, reason text, version integer)
 WHERE j.id = v.id AND j.schedule_version = v.version AND j.invalid_reason IS NULL
RETURNING j.id
"""

# Claims and settlements go in batches (migrations/0010): one statement for every
# run that became admissible (or finished) while the previous statement was in flight.
_CLAIM_MANY = """
SELECT * FROM coordinator._claim_many($1, $2, $3, $4, $5, $6)
"""

# A batch of one (a lone trigger on an idle daemon: its latency) goes straight to the
# per-item function _claim_many would call for it (fencing included): no JSON items, no
# batch bookkeeping, no subtransaction. Timestamps travel as text cast in SQL, like the
# batches' (no codec lookups).
_CLAIM_ONE = """
SELECT * FROM coordinator._claim($1, $2, $3::text::timestamptz, $4, $5, $6, $7, $8, $9,
                                 $10::text::timestamptz, $11::text::timestamptz)
"""

_SETTLE_MANY = "SELECT * FROM coordinator._settle_many($1)"

# Calls in progress on a stepped-down leader whose runs another daemon already ended.
_ENDED_ELSEWHERE = """
SELECT id FROM coordinator.runs
 WHERE id = ANY ($1::bigint[])
   AND status NOT IN ('running', 'pending', 'cancel_requested', 'unresolved')
"""

# Items that came back 'already', sent once more: a run another daemon's sweep left
# `unresolved` is settled after all ('late'), one ended otherwise is 'superseded'
# (migrations/0032). Never sent while nothing comes back 'already'.
_SETTLE_LATE = "SELECT * FROM coordinator._settle_late($1::text::json)"

# Runs given back (never sent: an outcome whose status is ``queued``): item by item, each
# in a subtransaction of its own (migrations/0023; they are rare, and _settle_many's
# set-based path does not know them).
_GIVE_BACK = "SELECT * FROM coordinator._settle_each($1::text::json, true)"

# A settlement batch of one, likewise straight to the _settle that _settle_many would run
# for it. Values travel as text cast in SQL (no codec lookups).
_SETTLE_ONE = """
SELECT * FROM coordinator._settle($1, $2, $3::text::timestamptz, $4::text::timestamptz, $5,
                                  $6::text::jsonb, $7, $8, $9, $10::text::timestamptz, $11,
                                  $12, $13, $14::text::jsonb, $15::text::jsonb)
"""

# It first waits for the fence (migrations/0018): claims of a previous leader still in
# flight on their backends commit before it looks, or are refused.
_SWEEP_LOST = "SELECT * FROM coordinator._sweep_lost($1, $2, $3)"
# Which attempt each swept run was: the function does not return it, and a join in its
# statement would read the rows as they were before its wait on the fence, missing the
# runs a dead leader's claims committed meanwhile (found in review). The sweep does not
# change the attempt: read after it, the lost runs only, and only when there are some
# (with the job's name, for the log line and the per-job metrics).
_LOST_ATTEMPTS = """
SELECT r.id, r.attempt, j.namespace || '/' || j.name AS key
  FROM coordinator.runs r JOIN coordinator.jobs j ON j.id = r.job_id
 WHERE r.id = ANY ($1::text::bigint[])
"""

# The calls a stop abandoned, of idempotent jobs: queued again once (migrations/0034).
_REQUEUE_ABANDONED = "SELECT * FROM coordinator._requeue_abandoned($1::text::bigint[], $2, $3, $4)"

# A pause wake names a run; any role may NOTIFY, so before a call of ours is stopped the
# run's own status says whether coordinator.pause_run asked it (cancel_requested).
_RUN_STATUS = "SELECT status FROM coordinator.runs WHERE id = $1"

# A worker's declared schedules (migrations/0014): coordinator.sync, only when it would
# change something.
_DECLARE = "SELECT * FROM coordinator._declare($1, $2::text::jsonb)"

# A spooled result PostgreSQL refused at start: its outcome is unknown to the database,
# so the run waits for an operator, with the reason; a recoverable run pauses at its last
# saved cursor instead (as the crash sweep does).
_MARK_UNRESOLVED = """
UPDATE coordinator.runs r
   SET status = CASE WHEN j.recoverable THEN 'paused' ELSE 'unresolved' END,
       error_cause = CASE WHEN j.recoverable THEN NULL ELSE 'lost' END,
       paused_at = CASE WHEN j.recoverable THEN now() END,
       error_message = $2
  FROM coordinator.jobs j
 WHERE r.id = $1 AND j.id = r.job_id AND r.status IN ('pending', 'running', 'cancel_requested')
"""

_SCHEMA_EXISTS = "SELECT to_regclass('coordinator.schema_migrations') IS NOT NULL"
_APPLIED_MIGRATIONS = "SELECT name FROM coordinator.schema_migrations"

# Progress of a running call (coalesced by the worker executor: at most one write per
# few seconds per run, never after the result).
_SAVE_PROGRESS = """
UPDATE coordinator.runs SET progress = $2::jsonb WHERE id = $1 AND status = 'running'
"""

# One coalesced write of a running recoverable call (or of any call's findings): cursor,
# counter total and a batch of findings, at most one per few seconds per run, never after
# the result (migrations/0012: coordinator._checkpoint).
_CHECKPOINT = """
SELECT coordinator._checkpoint($1, $2::text::jsonb, $3, $4::text::jsonb)
"""

# Alerts: open the (job, kind) window if it is closed (writes only then); see 0013.
_ALERT_OPEN = "SELECT * FROM coordinator._alert_open($1, $2, $3, $4, $5)"

# Retention: one bounded batch of deletions, one short transaction (0013).
_PRUNE = "SELECT * FROM coordinator._prune($1, $2, $3, $4, $5, $6, $7)"

_TRY_LOCK = "SELECT pg_try_advisory_lock($1, $2)"
_LOCK = "SELECT pg_advisory_lock($1, $2)"
#: Taken by the leader's session once it leads: claims probe it instead of reading
#: pg_locks (migrations/0020_cheap_fence.sql). Tried, never waited for: refused (a claim
#: of a dead leader with the same pid still holds it), claims read pg_locks as before.
#: It also reads the session's start, which with its pid names it beyond a reused pid
#: (:meth:`Store.end_own_lingering_lead`).
_ALIVE = """
SELECT pg_try_advisory_lock($1, -pg_backend_pid()),
       (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid())
"""
#: Ends the session holding the single-writer lock if it is the one named (pid and start):
#: this daemon's own lock session, cut on our side but still alive on the server.
_END_OWN_LEAD = """
SELECT pg_terminate_backend(a.pid)
  FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
 WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
   AND l.classid = $1::integer::oid AND l.objid = $2::integer::oid
   AND l.pid = $3 AND a.backend_start = $4
"""


def _broken_session(exc: BaseException) -> bool:
    """asyncpg's "cannot switch to state 12; another operation (2) is in progress": a
    session cut off mid-statement (a terminated backend) then asked for the next one, a
    transaction's ROLLBACK say. It was classed as refused (a spooled result's replay sets
    aside a record refused three times); the pool closes that connection as any failed
    one. Its other InternalClientErrors (a codec, a bind) are bugs of ours, refusals: as
    unavailable they would be retried forever."""
    return isinstance(exc, asyncpg.InternalClientError) and str(exc).startswith(
        "cannot switch to state"
    )


def _wrap(exc: BaseException, what: str) -> Exception:
    state = str(getattr(exc, "sqlstate", "") or "")
    if (
        isinstance(exc, _TRANSIENT)
        or state[:2] in _UNAVAILABLE_CLASSES
        or state in _UNAVAILABLE_STATES
        or _broken_session(exc)
    ):
        return StoreUnavailable(f"{what}: database unavailable ({type(exc).__name__}: {exc})")
    if state in _CONFLICT_STATES:
        return StoreConflict(f"{what}: {type(exc).__name__}: {one_line(exc)}")
    return DatabaseError(f"{what}: {type(exc).__name__}: {one_line(exc)}")


@attrs.define(eq=False)
class ConnectionPool:
    """A few daemon connections, opened on demand and reused without any reset SQL.

    asyncpg's own pool resets a connection on release (``UNLISTEN *; RESET ALL; ...``),
    which would add statements to every run; none of that state is used here, so the
    connections go back as they are. A connection that failed is closed, not returned.
    """

    dsn: str
    size: int = 4
    _free: list[Connection] = attrs.field(factory=list)
    _slots: trio.Semaphore = attrs.field(init=False)
    _all: set[Connection] = attrs.field(factory=set)

    def __attrs_post_init__(self) -> None:
        self._slots = trio.Semaphore(self.size)

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[Connection]:
        try:
            # A free slot is taken without yielding (the statement that follows yields
            # anyway): a lone claim's latency is a scheduler round shorter.
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            await self._slots.acquire()
        try:
            conn = self._free.pop() if self._free else None
            if conn is not None and conn.is_closed():
                self._all.discard(conn)
                conn = None
            if conn is None:
                conn = await connect(self.dsn, application_name=APP_DAEMON, daemon=True)
                self._all.add(conn)
            ok = False
            try:
                yield conn
                ok = True
            finally:
                if ok and not conn.is_closed():
                    self._free.append(conn)
                else:
                    self._all.discard(conn)
                    await close_quietly(conn, within=1.0)
        finally:
            self._slots.release()

    async def close(self) -> None:
        conns, self._all, self._free = list(self._all), set(), []
        for conn in conns:
            await close_quietly(conn)


ItemT = TypeVar("ItemT")
#: A claim waiting for its batch: the ticket, the worker types served, the daemon's
#: clock and the deadline to save should the claim skip a misfire.
_ClaimItem = tuple[Ticket, tuple[str, ...], datetime | None, datetime | None]
ResultT = TypeVar("ResultT")


@attrs.define(eq=False)
class _Slot(Generic[ResultT]):
    """One item's place in a batch: its result or its error, once the batch lands."""

    done: trio.Event = attrs.field(factory=trio.Event)
    #: Where the item goes in its batch (lowest first).
    order: int = 0
    result: ResultT | None = None
    error: BaseException | None = None
    #: Told the outcome instead (an item nobody waits for: :meth:`Batcher.submit_soon`).
    then: Callable[[ResultT | BaseException], None] | None = None

    def finish(self, outcome: ResultT | BaseException) -> None:
        if self.then is not None:
            self.then(outcome)
            return
        if isinstance(outcome, BaseException):
            self.error = outcome
        else:
            self.result = outcome
        self.done.set()


@attrs.define(eq=False)
class Batcher(Generic[ItemT, ResultT]):
    """Group commit for one kind of statement.

    Items submitted while a statement is in flight wait and go together in the next one;
    an item submitted to an idle batcher goes at once, sent by its own caller (after one
    yield, so that items submitted in the same turn go with it, in order), so batching
    costs an idle daemon no latency and no hand-off between tasks. ``send`` takes the
    items and returns, in order, a result or an exception per item (an item the database
    refused fails alone); if the statement itself fails, every item of that batch gets
    its error. Until :meth:`run` is started (a store used on its own) each item is sent
    by its caller, alone.
    """

    send: Callable[[list[ItemT]], Awaitable[list[ResultT | BaseException]]]
    #: Most items in one statement.
    limit: int = 512
    _queue: list[tuple[ItemT, _Slot[ResultT]]] = attrs.field(factory=list)
    _wake: trio.Event = attrs.field(factory=trio.Event)
    _running: bool = False
    #: A statement is in flight (sent by the batching task, or by an idle batcher's caller).
    _busy: bool = False
    #: An idle batcher's caller is about to send the next batch itself.
    _leading: bool = False
    #: Statements sent and items carried (for the benchmarks' batch sizes).
    batches: int = 0
    items: int = 0

    async def submit(self, item: ItemT, *, order: int = 0, alone: bool = False) -> ResultT:
        """Send ``item`` (with the next batch); a batch goes in ``order``. ``alone``: the
        caller knows no other item is about to be submitted, so an idle batcher sends at
        once instead of yielding first for company."""
        slot: _Slot[ResultT] = _Slot(order=order)
        if not self._running:
            await self._send([(item, slot)])
            return self._outcome(slot)
        self._queue.append((item, slot))
        if self._busy or self._leading:
            self._wake.set()
        else:
            # Idle: this caller sends the next batch itself, sparing the hand-offs to the
            # batching task and back (a lone claim's latency). It first lets the other
            # tasks that are ready now (claims admitted in the same turn) join it.
            self._leading = True
            try:
                try:
                    if not alone:
                        await trio.lowlevel.checkpoint()
                except BaseException:
                    # Cancelled before anything was sent: withdraw this item (nobody
                    # waits for it); the batching task sends the others.
                    self._queue = [entry for entry in self._queue if entry[1] is not slot]
                    raise
                finally:
                    self._leading = False
                if not self._busy:
                    # The batch may carry other callers' items: once sent, it is seen
                    # through (bounded by the statement timeout) whatever happens to
                    # this caller, as the batching task would.
                    with trio.CancelScope(shield=True):
                        await self._send_next()
            finally:
                if self._queue:
                    self._wake.set()
        if slot.done.is_set():
            # Sent by this caller: no need to yield a round for it (unless cancelled
            # meanwhile, which the caller then learns, as a waiting caller would).
            await trio.lowlevel.checkpoint_if_cancelled()
        else:
            await slot.done.wait()
        return self._outcome(slot)

    def submit_soon(
        self, item: ItemT, *, order: int = 0, then: Callable[[ResultT | BaseException], None]
    ) -> None:
        """Send ``item`` with the next batch without waiting for it: ``then`` is told its
        result or error by the task that sends the batch (no task of the caller's waits
        a scheduler round for it). ``then`` must be quick and must not raise but for a
        bug, which the sending task raises once every item of its batch is told. Only
        while :meth:`run` runs (the daemon's store serves): otherwise ``then`` is told
        at once that nothing was sent."""
        slot: _Slot[ResultT] = _Slot(order=order, then=then)
        if not self._running:
            slot.finish(StoreUnavailable("the store is not serving; not sent"))
            return
        self._queue.append((item, slot))
        self._wake.set()

    @staticmethod
    def _outcome(slot: _Slot[ResultT]) -> ResultT:
        if slot.error is not None:
            raise slot.error
        return cast("ResultT", slot.result)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Send batches until cancelled (a task of the daemon's nursery)."""
        self._running = True
        task_status.started()
        try:
            while True:
                while not self._queue or self._busy or self._leading:
                    self._wake = trio.Event()
                    await self._wake.wait()
                await self._send_next()
        finally:
            self._running = False
            queued, self._queue = self._queue, []
            # Nobody will send them now: their callers retry.
            self._finish_all(
                [(slot, StoreUnavailable("the daemon is stopping; not sent")) for _, slot in queued]
            )

    async def _send_next(self) -> None:
        """Send the queued items (in order, at most :attr:`limit`) as one statement."""
        if not self._queue:
            return  # (taken by the batching task's shutdown meanwhile)
        self._queue.sort(key=lambda entry: entry[1].order)
        batch, self._queue = self._queue[: self.limit], self._queue[self.limit :]
        self._busy = True
        try:
            await self._send(batch)
        finally:
            self._busy = False

    async def _send(self, batch: list[tuple[ItemT, _Slot[ResultT]]]) -> None:
        self.batches += 1
        self.items += len(batch)
        try:
            outcomes = await self.send([item for item, _slot in batch])
        except Exception as exc:
            self._finish_all([(slot, exc) for _item, slot in batch])
            return
        except BaseException:
            # Cancelled mid-statement: its outcome is unknown to us; the callers' error
            # policy treats it as unavailable (a claim is retried and refused as
            # outstanding if it did commit; a settlement is idempotent).
            cancelled = StoreUnavailable("the statement was cancelled")
            self._finish_all([(slot, cancelled) for _item, slot in batch])
            raise
        self._finish_all(
            [(slot, outcome) for (_item, slot), outcome in zip(batch, outcomes, strict=True)]
        )

    def _finish_all(self, landed: list[tuple[_Slot[ResultT], ResultT | BaseException]]) -> None:
        """Tell every slot its outcome; a ``then`` that raised (a bug) is raised after all
        of them were told, so that one bug cannot strand the other items' callers."""
        failed: Exception | None = None
        for slot, outcome in landed:
            try:
                slot.finish(outcome)
            except Exception as exc:
                failed = failed or exc
        if failed is not None:
            raise failed


def _item_error(what: str, state: str, message: str) -> Exception:
    """The exception an item of a batch failed with, classified like any other."""
    if state[:2] in _UNAVAILABLE_CLASSES or state in _UNAVAILABLE_STATES:
        return StoreUnavailable(f"{what}: database unavailable ({state}: {message})")
    if state in _CONFLICT_STATES:
        return StoreConflict(f"{what}: {message}")
    return DatabaseError(f"{what}: {message}")


@attrs.define(eq=False)
class _Shared:
    """One object per distinct value across the pages of a refresh: many jobs share a
    schedule, a priority, a worker type and a deadline, so memory grows with distinct
    values, not with the job count (a million deadlines as separate datetimes are 48 MB)."""

    schedules: dict[tuple[str, str | None, str], Schedule] = attrs.field(factory=dict)
    texts: dict[str, str] = attrs.field(factory=dict)
    #: Saved deadlines by their microseconds since the epoch.
    times: dict[int, datetime] = attrs.field(factory=dict)

    def entries(self, rows: Sequence[Record]) -> RefreshPage:
        """Entries from rows of ``_REFRESH``: each record unpacked in one step, each
        entry built with positional arguments (half the time of reading by position and
        passing keywords, at a million rows)."""
        schedules, texts, times = self.schedules, self.texts, self.times
        entries: list[JobEntry] = []
        defined: dict[int, int] = {}
        parked: list[int] = []
        append = entries.append
        for (
            job_id, key, kind, expression, timezone, priority, worker_type, next_run_us,
            schedule_version, run_id, run_status, run_created_at, run_due_at, defined_us,
            is_parked,
        ) in rows:  # fmt: skip
            if is_parked:
                parked.append(job_id)
                continue
            if defined_us is not None:
                defined[job_id] = defined_us
            shape = (kind, expression, timezone)
            schedule = schedules.get(shape)
            if schedule is None:
                schedule = schedules[shape] = Schedule(
                    kind=kind, expression=expression, timezone=timezone
                )
            if next_run_us is None:
                next_run_at = None
            else:
                next_run_at = times.get(next_run_us)
                if next_run_at is None:
                    next_run_at = times[next_run_us] = _EPOCH + timedelta(microseconds=next_run_us)
            append(
                JobEntry(
                    job_id,
                    key,
                    schedule,
                    texts.setdefault(priority, priority),
                    texts.setdefault(worker_type, worker_type) if worker_type else None,
                    next_run_at,
                    schedule_version,
                    run_id,
                    run_status,
                    run_created_at,
                    run_due_at,
                )
            )
        return RefreshPage(entries, defined, parked)


@attrs.frozen
class RefreshPage:
    """One page of a refresh: its entries, and when each job that has no saved deadline
    was last defined (microseconds since the epoch, the database's clock)."""

    entries: list[JobEntry]
    defined: dict[int, int]
    #: Paused or invalid jobs blocked by an unresolved run: not loaded, only counted.
    parked: list[int] = attrs.field(factory=list)


@attrs.define(eq=False)
class Store:
    """The daemon's SQL. One instance per daemon; safe for concurrent tasks (each call
    takes its own pooled connection)."""

    pool: ConnectionPool
    #: Name recorded on the runs this daemon claims.
    instance: str
    #: Per-statement bound (seconds); the claim and settlement are short by design.
    statement_timeout: float = 30.0
    #: Backend pid of the session holding the single-writer lock (claims are fenced on it).
    leader_pid: int | None = None
    #: The last lock session this daemon held, as (pid, start): kept after it is lost.
    led_by: tuple[int, datetime] | None = None
    #: Statements sent so far (``coordinator_sql_statements_total``).
    statements: int = 0
    claims: Batcher[_ClaimItem, ClaimResult] = attrs.field(init=False)
    settlements: Batcher[HeldResult, JobState] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.claims = Batcher(send=self._claim_batch)
        self.settlements = Batcher(send=self._settle_batch)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Batch claims and settlements until cancelled (the daemon runs this)."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.claims.run)
            await nursery.start(self.settlements.run)
            task_status.started()

    def count(self, n: int = 1) -> None:
        """Count statements sent on the daemon's behalf outside :meth:`_call` (LISTEN)."""
        self.statements += n

    async def _call(self, what: str, method: str, sql: str, *args: Any, rows: int = 0) -> Any:
        """Send one statement on a pooled connection, bounded in time: the statement
        timeout, plus :data:`SECONDS_PER_MILLION_ROWS` for each million rows it touches
        (a first start writes a deadline per job)."""
        # The bound is trio's, not asyncpg's: asyncpg's timeout leaves an asyncio timer
        # behind under trio-asyncio that wakes the idle process when it expires.
        self.statements += 1
        bound = self.statement_timeout + SECONDS_PER_MILLION_ROWS * rows / 1e6
        try:
            with trio.fail_after(bound):
                async with self.pool.acquire() as conn:
                    return await aio_here(getattr(conn, method)(sql, *args))
        except DatabaseUnavailable as exc:
            raise StoreUnavailable(f"{what}: {exc}") from exc
        except trio.TooSlowError as exc:
            raise StoreUnavailable(f"{what}: no answer within {bound:g}s") from exc
        except Exception as exc:
            raise _wrap(exc, what) from exc

    # -- leadership ---------------------------------------------------------------------

    async def try_lead(self, conn: Connection) -> bool:
        """Take the single-writer lock on ``conn`` if it is free (one statement; one more
        once taken)."""
        self.statements += 1
        try:
            got: bool = await aio(conn.fetchval)(_TRY_LOCK, LOCK_CLASS, LOCK_OBJECT)
            if got:
                await self._alive(conn)
        except Exception as exc:
            raise _wrap(exc, "leadership") from exc
        if got:
            self.leader_pid = conn.get_server_pid()
        return got

    async def _alive(self, conn: Connection) -> None:
        """Take the probe lock that tells claims this session leads, and note the
        session's pid and start (one statement, once per leadership)."""
        self.statements += 1
        row = await aio(conn.fetchrow)(_ALIVE, LOCK_CLASS)
        if row is not None and row[1] is not None:
            self.led_by = (conn.get_server_pid(), row[1])

    async def end_own_lingering_lead(self, conn: Connection) -> bool:
        """End this daemon's last lock session if it still holds the lock on the server
        (one statement, only after a lost lead found the lock taken). A session cut on our
        side (a network cut, our end's keepalive) stays alive on the server until its own
        probes give up, about a minute: holding the lock, it made its daemon step down as
        if another daemon led. Named by pid and start, it is never another's session.
        ``True`` if it was ended; ``False`` if the lock is another's or ending it was
        refused (a role that may not signal it: the daemon steps down as before)."""
        if self.led_by is None:
            return False
        pid, started = self.led_by
        self.statements += 1
        try:
            ended = await aio(conn.fetchval)(_END_OWN_LEAD, LOCK_CLASS, LOCK_OBJECT, pid, started)
        except asyncpg.InsufficientPrivilegeError:
            return False
        except Exception as exc:
            raise _wrap(exc, "leadership") from exc
        return bool(ended)

    async def wait_lead(self, conn: Connection) -> None:
        """Wait for the single-writer lock: one statement that blocks until the leader's
        session ends (and one more once taken). A standby sends nothing else meanwhile."""
        self.statements += 1
        try:
            await aio(conn.fetchval)(_LOCK, LOCK_CLASS, LOCK_OBJECT)
            await self._alive(conn)
        except Exception as exc:
            raise _wrap(exc, "leadership") from exc
        self.leader_pid = conn.get_server_pid()

    # -- inventory ----------------------------------------------------------------------

    async def read_pages(
        self, ids: Sequence[int] | None, out: trio.MemorySendChannel[RefreshPage]
    ) -> None:
        """Send on ``out`` every job that may need a timer or a dispatch, a page of at most
        :data:`REFRESH_PAGE` entries per statement (an inventory smaller than a page: one
        statement), or only those of ``ids`` that may (one statement); then close it.
        The next page is read while the last one is turned into entries: the server's
        work on one overlaps the daemon's on the other."""
        async with out:
            shared = _Shared()
            if ids is not None:
                text = "{" + ",".join(str(int(i)) for i in ids) + "}"
                rows = await self._call("refresh", "fetch", _REFRESH_SOME, text)
                await out.send(shared.entries(rows))
                return
            rows_out, rows_in = trio.open_memory_channel["list[Record]"](0)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_rows, rows_out)
                async with rows_in:
                    async for rows in rows_in:
                        page = shared.entries(rows)
                        del rows  # the records go before the next page is taken
                        await out.send(page)

    async def _read_rows(self, out: trio.MemorySendChannel[list[Record]]) -> None:
        """The pages of a full refresh as records, in id order (the primary key's index),
        each statement sent as soon as the last page is taken."""
        async with out:
            after = 0
            while True:
                rows: list[Record] = await self._call(
                    "refresh", "fetch", _REFRESH_PAGE, after, REFRESH_PAGE, rows=REFRESH_PAGE
                )
                if not rows:
                    return
                after = rows[-1][0]
                full = len(rows) == REFRESH_PAGE
                await out.send(rows)
                del rows
                if not full:
                    return

    async def init_deadlines(self, firsts: FirstDeadlines) -> set[int]:
        """Save first deadlines where none is saved (one statement); returns the ids *not*
        written (a deadline or the schedule changed meanwhile, or the job was removed:
        the next refresh reads them), found by a second statement only when the count
        written falls short."""
        ids = firsts.ids
        if not ids:
            return set()
        # Jobs share deadlines (each is sent once; a job names its deadline's position)
        # and schedule versions: each of those is formatted once.
        positions: dict[datetime, str] = {}
        ks = [
            positions.get(at) or positions.setdefault(at, str(len(positions) + 1))
            for at in firsts.ats
        ]
        texts: dict[int, str] = {}
        versions = [texts.get(v) or texts.setdefault(v, str(v)) for v in firsts.versions]
        args = (
            "{" + ",".join(map(str, ids)) + "}",
            "{" + ",".join(versions) + "}",
            "{" + ",".join(ks) + "}",
            "{" + ",".join(at.isoformat() for at in positions) + "}",
            min(ids),
            max(ids),
        )
        status: str = await self._call(
            "init_deadlines", "execute", _INIT_DEADLINES, *args, rows=len(ids)
        )
        if int(status.rsplit(" ", 1)[-1]) == len(ids):
            return set()
        rows = await self._call("init_deadlines", "fetch", _REFUSED_DEADLINES, *args, rows=len(ids))
        return {r[0] for r in rows}

    async def mark_invalid(self, items: Sequence[tuple[int, str, int]]) -> set[int]:
        """Make jobs with unusable schedules inert (job id, reason, schedule version)."""
        if not items:
            return set()
        batch = [{"id": i, "reason": reason, "version": v} for i, reason, v in items]
        rows = await self._call("mark_invalid", "fetch", _MARK_INVALID, json.dumps(batch))
        return {r["id"] for r in rows}

    # -- claim and settlement -----------------------------------------------------------

    async def claim(
        self,
        ticket: Ticket,
        *,
        workers: Sequence[str],
        now: datetime | None = None,
        skip_next: datetime | None = None,
        order: int = 0,
        alone: bool = False,
    ) -> ClaimResult:
        """The one claim boundary, for scheduled (``ticket.run_id`` None), manual and
        retry dispatch; grouped with other claims under load (:class:`Batcher`), in
        ``order`` (admission's) within a batch. ``now`` is the daemon's clock (misfires
        and due times are judged by it; without it nothing misfires and a retry's due
        time is judged by the database's clock); ``skip_next`` the deadline to save in
        place of one that misfired. ``alone``: no other claim is about to be submitted, so
        an idle batcher need not wait a scheduler round for company."""
        return await self.claims.submit(
            (ticket, tuple(workers), now, skip_next), order=order, alone=alone
        )

    async def _claim_batch(self, items: list[_ClaimItem]) -> list[ClaimResult | BaseException]:
        if len(items) == 1:
            return [await self._claim_one(items[0])]
        batch = [
            {
                "i": i,
                "job": t.job_id,
                "run": t.run_id,
                "at": _text(t.scheduled_for),
                "v": t.schedule_version,
                "now": _text(now),
                "skip": _text(skip),
            }
            for i, (t, _workers, now, skip) in enumerate(items)
        ]
        workers = list(items[-1][1])  # the latest view of who is connected
        rows: list[Record] = await self._call(
            "claim",
            "fetch",
            _CLAIM_MANY,
            json.dumps(batch),
            self.instance,
            workers,
            self.leader_pid,
            LOCK_CLASS,
            LOCK_OBJECT,
        )
        out: list[ClaimResult | BaseException] = [
            StoreUnavailable("claim: no answer for this item")
        ] * len(items)
        # Only granted claims take a place in the batch's turnstile (their calls start in
        # the batch's order); a refusal or an error has nothing to start.
        batch_no = self.claims.batches
        granted = sorted(
            row["i"] for row in rows if row["err_state"] is None and row["reason"] is None
        )
        rank = {index: position for position, index in enumerate(granted)}
        for row in rows:
            index = row["i"]
            if row["err_state"] is not None:
                out[index] = _item_error("claim", row["err_state"], row["err_message"])
            elif row["reason"] == "misfire":
                out[index] = ClaimResult(
                    reason="misfire", skipped=row["scheduled_for"], next_run_at=row["next_run_at"]
                )
            elif row["reason"] is not None:
                out[index] = ClaimResult(reason=row["reason"])
            else:
                place = (batch_no, rank[index], len(granted))
                out[index] = _claim_result(row, items[index][0].job_id, place)
        return out

    async def _claim_one(self, item: _ClaimItem) -> ClaimResult:
        """A batch of one, as :data:`_CLAIM_ONE` (the same rules: ``_claim`` is what the
        batch function runs for each of its items)."""
        ticket, workers, now, skip = item
        row: Record = await self._call(
            "claim",
            "fetchrow",
            _CLAIM_ONE,
            ticket.job_id,
            ticket.run_id,
            _text(ticket.scheduled_for),
            ticket.schedule_version,
            self.instance,
            list(workers),
            self.leader_pid,
            LOCK_CLASS,
            LOCK_OBJECT,
            _text(now),
            _text(skip),
        )
        if row["reason"] == "misfire":
            return ClaimResult(
                reason="misfire", skipped=row["scheduled_for"], next_run_at=row["next_run_at"]
            )
        if row["reason"] is not None:
            return ClaimResult(reason=row["reason"])
        return _claim_result(row, ticket.job_id, (self.claims.batches, 0, 1))

    async def settle(self, held: HeldResult) -> JobState:
        """Save a result and its job's next deadline in one transaction (grouped with
        other settlements under load), or, when the job's retry policy asks for one,
        queue the retry instead of moving the deadline. Idempotent: a result saved
        before comes back as ``already`` (with the retry it queued then, if it still
        waits)."""
        return await self.settlements.submit(held)

    async def settle_alone(self, held: HeldResult) -> JobState:
        """:meth:`settle`, sent at once in a statement of its own, and cut short if the
        caller is cancelled: the stop's flush, bounded by its deadline (a batch is seen
        through whatever happens to its caller, since it may carry others' items)."""
        (state,) = await self._settle_batch([held])
        if isinstance(state, BaseException):
            raise state
        return state

    def settle_soon(
        self, held: HeldResult, then: Callable[[JobState | BaseException], None]
    ) -> None:
        """:meth:`settle` without waiting: ``then`` is told the job's state, or the
        error, once the batch carrying it lands (:meth:`Batcher.submit_soon`)."""
        self.settlements.submit_soon(held, then=then)

    async def _settle_batch(self, items: list[HeldResult]) -> list[JobState | BaseException]:
        back = [i for i, h in enumerate(items) if h.outcome.status == "queued"]
        if not back:
            states: list[JobState | BaseException]
            if len(items) == 1:
                states = [await self._settle_one(items[0])]
            else:
                states = await self._settle_items(_SETTLE_MANY, items)
            return await self._settle_late(items, states)
        # Give-backs go apart (a statement of their own after the results, if any); each
        # statement's failure is its own items' only.
        out: list[JobState | BaseException] = [
            StoreUnavailable("settle: no answer for this item")
        ] * len(items)
        rest = [i for i, h in enumerate(items) if h.outcome.status != "queued"]
        for indexes, gives_back in ((rest, False), (back, True)):
            if not indexes:
                continue
            part = [items[i] for i in indexes]
            done: list[JobState | BaseException]
            try:
                if gives_back:
                    done = await self._settle_items(_GIVE_BACK, part)
                    # (A run another leader swept `unresolved` that provably never
                    # started: given back all the same, not left blocking its job.)
                    done = await self._settle_late(part, done)
                else:
                    done = await self._settle_batch(part)
            except Exception as exc:  # (told to each of them, as the batcher would)
                done = [exc] * len(indexes)
            for i, state in zip(indexes, done, strict=True):
                out[i] = state
        return out

    async def _settle_late(
        self, items: list[HeldResult], states: list[JobState | BaseException]
    ) -> list[JobState | BaseException]:
        """Send the results that came back ``already`` once more, to be saved over an
        ``unresolved`` mark another daemon's sweep left (``late``) or told apart from a
        result saved before (``superseded``: the run was ended otherwise)."""
        again = [
            i
            for i, state in enumerate(states)
            if isinstance(state, JobState) and state.outcome == "already"
        ]
        if not again:
            return states
        try:
            done = await self._settle_items(_SETTLE_LATE, [items[i] for i in again])
        except Exception as exc:  # (held and re-sent whole, as the batcher would)
            done = [exc] * len(again)
        out = list(states)
        for i, state in zip(again, done, strict=True):
            out[i] = state
        return out

    async def _settle_items(
        self, statement: str, items: list[HeldResult]
    ) -> list[JobState | BaseException]:
        batch = [
            {
                "i": i,
                "run": h.run_id,
                "status": h.outcome.status,
                "started": h.outcome.started_at.isoformat(),
                "finished": h.outcome.finished_at.isoformat(),
                "count": h.outcome.count,
                "extra": h.outcome.extra,
                "cause": h.outcome.error_cause,
                "message": h.outcome.error_message,
                "v": h.schedule_version,
                "next": _text(h.next_run_at),
                "category": h.outcome.category,
                "retryable": h.outcome.retryable,
                "jitter": h.retry_jitter,
                **_recoverable_item(h),
                # A give-back's job (found again if its run was removed by a first try)
                # and its claim (the one it undoes: never a later claim of the run).
                **(
                    {"jid": h.job_id, "ca": _text(h.claimed_at)}
                    if h.outcome.status == "queued"
                    else {}
                ),
            }
            for i, h in enumerate(items)
        ]
        rows: list[Record] = await self._call(
            "settle", "fetch", statement, json.dumps(batch, default=str)
        )
        out: list[JobState | BaseException] = [
            StoreUnavailable("settle: no answer for this item")
        ] * len(items)
        for row in rows:
            index = row["i"]
            if row["err_state"] is not None:
                out[index] = _item_error("settle", row["err_state"], row["err_message"])
            else:
                out[index] = _job_state(row)
        return out

    async def _settle_one(self, held: HeldResult) -> JobState:
        """A batch of one, as :data:`_SETTLE_ONE` (the same values the batch item carries;
        a cursor that is JSON null is ``'null'``, no cursor is SQL NULL)."""
        outcome = held.outcome
        row: Record = await self._call(
            "settle",
            "fetchrow",
            _SETTLE_ONE,
            held.run_id,
            outcome.status,
            outcome.started_at.isoformat(),
            outcome.finished_at.isoformat(),
            outcome.count,
            None if outcome.extra is None else json.dumps(outcome.extra, default=str),
            outcome.error_cause,
            outcome.error_message,
            held.schedule_version,
            _text(held.next_run_at),
            outcome.category,
            outcome.retryable,
            held.retry_jitter,
            None if outcome.cursor is None else json.dumps(outcome.cursor.value, default=str),
            (
                json.dumps([f.to_json() for f in outcome.findings], default=str)
                if outcome.findings
                else None
            ),
        )
        return _job_state(row)

    async def mark_unresolved(self, run_id: int, reason: str) -> None:
        """Leave a run for an operator (its spooled result was refused at start)."""
        await self._call("mark_unresolved", "execute", _MARK_UNRESOLVED, run_id, reason)

    async def migrate(self) -> list[str]:
        """Apply pending migrations (``coordinator run --migrate``); their names."""
        from . import migrate as migrations

        try:
            with trio.fail_after(self.statement_timeout * 4):
                async with self.pool.acquire() as conn:
                    applied = await migrations.migrate(conn)
        except trio.TooSlowError as exc:
            raise StoreUnavailable("migrate: no answer in time") from exc
        except CoordinatorError:
            raise
        except Exception as exc:
            raise _wrap(exc, "migrate") from exc
        self.statements += 3 + 2 * len(applied)  # lock, bootstrap, read; each file + record
        return applied

    async def applied_migrations(self) -> set[str] | None:
        """Names of the applied migrations; ``None`` when the schema was never migrated."""
        if not await self._call("schema", "fetchval", _SCHEMA_EXISTS):
            return None
        rows = await self._call("schema", "fetch", _APPLIED_MIGRATIONS)
        return {r["name"] for r in rows}

    async def save_progress(self, run_id: int, snapshot: dict[str, Any]) -> None:
        """The latest progress snapshot of a running call."""
        await self._call(
            "save_progress", "execute", _SAVE_PROGRESS, run_id, json.dumps(snapshot, default=str)
        )

    async def save_checkpoint(self, run_id: int, write: CheckpointWrite) -> bool:
        """One coalesced write of a running call (cursor, counter total, findings); one
        statement. ``False`` when the run is no longer running (nothing was written)."""
        findings = json_text([f.to_json() for f in write.findings]) if write.findings else None
        saved: bool = await self._call(
            "save_checkpoint",
            "fetchval",
            _CHECKPOINT,
            run_id,
            None if write.cursor is None else json_text(write.cursor.value),
            write.count,
            findings,
        )
        return saved

    async def alert_open(
        self, *, job_id: int, kind: str, run_id: int, now: datetime, window: timedelta
    ) -> AlertWindow:
        """Open the alert window of (job, kind) if it is closed: one statement, which
        writes only when an alert is due."""
        row = await self._call(
            "alert_window", "fetchrow", _ALERT_OPEN, job_id, kind, run_id, now, window
        )
        return AlertWindow(
            outcome=row["outcome"],
            namespace=row["namespace"],
            name=row["name"],
            until=row["until"],
            previous=row["previous"],
            suppressed=row["suppressed"] or 0,
        )

    async def prune_batch(
        self,
        *,
        resume: tuple[int, int],
        limit: int,
        max_jobs: int,
        now: datetime,
        retention: timedelta,
        keep_last: int,
    ) -> PruneBatch:
        """Delete at most ``limit`` runs retention lets go, from ``resume`` on (one
        statement, one short transaction)."""
        row = await self._call(
            "prune", "fetchrow", _PRUNE, resume[0], resume[1], limit, max_jobs, now,
            retention, keep_last,
        )  # fmt: skip
        nxt = row["next_job"]
        return PruneBatch(
            deleted=row["deleted"],
            removed_jobs=row["removed_jobs"],
            jobs_seen=row["jobs_seen"],
            resume=None if nxt is None else (nxt, row["next_after"]),
        )

    async def declare(self, namespace: str, entries: Sequence[dict[str, Any]]) -> Declared:
        """Sync a worker's declared schedules into ``namespace`` (one statement; nothing
        is written when nothing differs). The caller checked the worker's right to it."""
        row = await self._call(
            "declare", "fetchrow", _DECLARE, namespace, json.dumps(list(entries), default=str)
        )
        return Declared(
            created=row["created"],
            updated=row["updated"],
            paused=row["paused"],
            unchanged=bool(row["unchanged"]),
        )

    async def run_status(self, run_id: int) -> str | None:
        """The run's status, ``None`` if there is no such run (one statement)."""
        status: str | None = await self._call("run_status", "fetchval", _RUN_STATUS, run_id)
        return status

    async def ended_elsewhere(self, run_ids: Sequence[int]) -> list[int]:
        """Of ``run_ids`` (calls in progress here), those the database shows ended by
        someone else: swept by another leader into a retry or a pause, resolved,
        cancelled. Not an ``unresolved`` one: its result, saved late, resolves it
        (migrations/0032). One statement; a stepped-down leader's only."""
        rows = await self._call("ended_elsewhere", "fetch", _ENDED_ELSEWHERE, list(run_ids))
        return [int(r["id"]) for r in rows]

    async def requeue_abandoned(self, runs: Sequence[int]) -> list[tuple[int, int]]:
        """Queue again, once, the runs of idempotent jobs whose calls this stop abandoned
        (saved ``cancelled`` by now; one statement, only when there are some, fenced as a
        claim is): (run, its retry) for each one queued."""
        if not runs:
            return []
        ids = "{" + ",".join(str(int(r)) for r in runs) + "}"
        rows = await self._call(
            "requeue", "fetch", _REQUEUE_ABANDONED, ids, self.leader_pid, LOCK_CLASS, LOCK_OBJECT
        )
        return [(int(r["run_id"]), int(r["retry_id"])) for r in rows]

    async def sweep_lost(self) -> list[LostRun]:
        """Mark runs left pending/running by a dead daemon (startup only, once the lock is
        ours). Waits first for the claims a dead leader's backends are still running, so
        that none of them can commit a run this sweep does not see."""
        rows = await self._call(
            "sweep_lost", "fetch", _SWEEP_LOST, self.instance, LOCK_CLASS, LOCK_OBJECT
        )
        attempts: dict[int, int] = {}
        keys: dict[int, str] = {}
        if rows:
            ids = "{" + ",".join(str(int(r["run_id"])) for r in rows) + "}"
            read = await self._call("sweep_lost", "fetch", _LOST_ATTEMPTS, ids)
            attempts = {r["id"]: r["attempt"] for r in read}
            keys = {r["id"]: r["key"] for r in read}
        return [
            LostRun(
                run_id=r["run_id"],
                job_id=r["job_id"],
                action=r["action"],
                attempt=attempts.get(r["run_id"]),
                job=keys.get(r["run_id"]),
            )
            for r in rows
        ]


def _claim_result(row: Record, job_id: int, place: tuple[int, int, int]) -> ClaimResult:
    job, target_error = job_from_row(row, job_id=job_id)
    cursor = row["cursor"]
    return ClaimResult(
        claim=Claim(
            run_id=row["run_id"],
            job=job,
            trigger=row["trigger"],
            scheduled_for=row["scheduled_for"],
            args=json_object(row["args"]),
            attempt=row["attempt"],
            claimed_at=row["claimed_at"],
            cursor=None if cursor is None else Cursor(value=json_value(cursor)),
            count=row["count"],
            resumes=row["resumes"],
        ),
        target_error=target_error,
        place=place,
    )


def _job_state(row: Record) -> JobState:
    return JobState(
        outcome=row["outcome"],
        job_id=row["job_id"],
        paused=bool(row["paused"]),
        invalid=bool(row["invalid"]),
        schedule_version=row["schedule_version"],
        next_run_at=row["next_run_at"],
        retry_run_id=row["retry_run_id"],
        retry_due_at=row["retry_due_at"],
        exhausted=bool(row["exhausted"]),
        category=row["category"],
    )


def _text(at: datetime | None) -> str | None:
    """A timestamp as the text the statements cast to ``timestamptz`` (``None``: NULL)."""
    return None if at is None else at.isoformat()


def _recoverable_item(held: HeldResult) -> dict[str, Any]:
    """A settlement item's cursor (wrapped: ``{"v": null}`` is the cursor JSON null, an
    absent key leaves the run's cursor as it is) and its unwritten findings
    (migrations/0012)."""
    outcome = held.outcome
    out: dict[str, Any] = {}
    if outcome.cursor is not None:
        out["cursor"] = {"v": outcome.cursor.value}
    if outcome.findings:
        out["findings"] = [f.to_json() for f in outcome.findings]
    return out


__all__ = [
    "AlertWindow",
    "ClaimResult",
    "ConnectionPool",
    "Declared",
    "FirstDeadlines",
    "JobEntry",
    "JobState",
    "LostRun",
    "PruneBatch",
    "RefreshPage",
    "Store",
    "StoreUnavailable",
]
