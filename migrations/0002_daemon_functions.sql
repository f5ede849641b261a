-- The daemon's claim, settlement and crash sweep, each one statement for the daemon to
-- send (coordinator/store.py calls them). They are functions so that each step inside
-- runs with a fresh snapshot after the row lock is taken, and so that a dispatched run
-- costs two statements in PostgreSQL's log: one claim, one settlement.
--
-- Lock order everywhere: the job row first, then its runs. Claims and settlements of the
-- same job therefore queue instead of deadlocking. The job row is locked FOR NO KEY
-- UPDATE, not FOR UPDATE: inserting a run takes FOR KEY SHARE on its job (the foreign
-- key check), and a claim waiting on a concurrent trigger()'s uncommitted run must not
-- block that trigger's own foreign key check, or the two would deadlock.

-- One claim boundary for scheduled and manual dispatch. Returns one row: `reason` is NULL
-- when the claim was granted (then the run is `running`, owned by p_instance, and the
-- other columns describe the job as it was under the lock), else why it was refused:
--   gone         the job (or the manual run) no longer exists
--   fenced       p_leader_pid no longer holds the single-writer lock
--   paused       the job is paused (a manual run stays queued until resume)
--   invalid      the job's schedule is unusable
--   version      the schedule changed since the deadline was armed
--   deadline     the saved deadline is not the one armed
--   unavailable  no connected worker serves the job's type
--   outstanding  another run of the job is queued, pending, running or unresolved
--   not_queued   the manual run is no longer queued (cancelled, or claimed already)
CREATE FUNCTION coordinator._claim(
    p_job_id        bigint,
    p_run_id        bigint,       -- the queued run of a manual dispatch, NULL for a deadline
    p_scheduled_for timestamptz,  -- the armed deadline (scheduled dispatch)
    p_version       integer,      -- schedule_version the deadline was armed for
    p_instance      text,
    p_workers       text[],       -- worker types currently served
    p_leader_pid    integer,      -- backend pid holding the single-writer lock, or NULL
    p_lock_class    integer,
    p_lock_obj      integer,
    OUT reason           text,
    OUT run_id           bigint,
    OUT trigger          text,
    OUT args             jsonb,
    OUT attempt          integer,
    OUT scheduled_for    timestamptz,
    OUT claimed_at       timestamptz,
    OUT namespace        text,
    OUT name             text,
    OUT schedule_kind    text,
    OUT schedule         text,
    OUT timezone         text,
    OUT target           jsonb,
    OUT params           jsonb,
    OUT timeout          interval,
    OUT priority         text,
    OUT idempotent       boolean,
    OUT schedule_version integer,
    OUT next_run_at      timestamptz
)
LANGUAGE plpgsql AS $$
DECLARE
    j coordinator.jobs;
    r coordinator.runs;
BEGIN
    IF p_leader_pid IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM pg_locks l
         WHERE l.locktype = 'advisory' AND l.pid = p_leader_pid AND l.granted
           AND l.classid = p_lock_class::oid AND l.objid = p_lock_obj::oid AND l.objsubid = 2
    ) THEN
        reason := 'fenced';
        RETURN;
    END IF;

    SELECT * INTO j FROM coordinator.jobs WHERE id = p_job_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        reason := 'gone';
        RETURN;
    END IF;

    IF p_run_id IS NOT NULL THEN
        SELECT * INTO r FROM coordinator.runs WHERE id = p_run_id AND job_id = p_job_id FOR UPDATE;
        IF NOT FOUND THEN
            reason := 'gone';
            RETURN;
        ELSIF r.status <> 'queued' THEN
            reason := 'not_queued';
            RETURN;
        END IF;
    END IF;

    IF j.paused THEN
        reason := 'paused';
    ELSIF j.invalid_reason IS NOT NULL THEN
        reason := 'invalid';
    ELSIF p_run_id IS NULL AND j.schedule_version <> p_version THEN
        reason := 'version';
    ELSIF p_run_id IS NULL AND j.next_run_at IS DISTINCT FROM p_scheduled_for THEN
        -- (Not compared with now(): the daemon's clock decided the deadline is due, and a
        -- database clock a little behind must not refuse it.)
        reason := 'deadline';
    ELSIF j.target->>'kind' = 'worker'
          AND NOT ((j.target->>'type') = ANY (coalesce(p_workers, '{}'))) THEN
        reason := 'unavailable';
    END IF;
    IF reason IS NOT NULL THEN
        RETURN;
    END IF;

    IF p_run_id IS NOT NULL THEN
        UPDATE coordinator.runs
           SET status = 'running', claimed_at = now(), started_at = now(),
               instance = p_instance, schedule_version = j.schedule_version
         WHERE id = p_run_id
        RETURNING * INTO r;
    ELSE
        INSERT INTO coordinator.runs (job_id, trigger, status, scheduled_for, claimed_at,
                                      started_at, schedule_version, instance)
        VALUES (j.id, 'schedule', 'running', p_scheduled_for, now(), now(),
                j.schedule_version, p_instance)
        ON CONFLICT (job_id) WHERE status IN ('queued', 'pending', 'running', 'unresolved')
        DO NOTHING
        RETURNING * INTO r;
        IF r.id IS NULL THEN
            reason := 'outstanding';
            RETURN;
        END IF;
    END IF;

    run_id := r.id;
    trigger := r.trigger;
    args := r.args;
    attempt := r.attempt;
    scheduled_for := r.scheduled_for;
    claimed_at := r.claimed_at;
    namespace := j.namespace;
    name := j.name;
    schedule_kind := j.schedule_kind;
    schedule := j.schedule;
    timezone := j.timezone;
    target := j.target;
    params := j.params;
    timeout := j.timeout;
    priority := j.priority;
    idempotent := j.idempotent;
    schedule_version := j.schedule_version;
    next_run_at := j.next_run_at;
END
$$;

-- Save a run's result and, in the same transaction, the job's next deadline.
--
-- The deadline is written only if the schedule is the one the run was claimed under
-- (an edit made meanwhile stands) and only if the run consumed the saved deadline: a
-- scheduled run always does; a manual run does when the deadline elapsed while it ran
-- (that tick was skipped, not owed). Idempotent: a run that is already terminal is
-- left alone (`outcome` = 'already'), so a retried or replayed settlement is harmless.
-- Returns the job's state after the write so the daemon can re-arm without a refresh.
CREATE FUNCTION coordinator._settle(
    p_run_id        bigint,
    p_status        text,
    p_started_at    timestamptz,
    p_finished_at   timestamptz,
    p_count         bigint,
    p_extra         jsonb,
    p_error_cause   text,
    p_error_message text,
    p_version       integer,
    p_next_run_at   timestamptz,
    OUT outcome          text,     -- 'saved' | 'already' | 'gone'
    OUT job_id           bigint,
    OUT paused           boolean,
    OUT invalid          boolean,
    OUT schedule_version integer,
    OUT next_run_at      timestamptz
)
LANGUAGE plpgsql AS $$
DECLARE
    j coordinator.jobs;
    r coordinator.runs;
BEGIN
    SELECT jobs.* INTO j FROM coordinator.jobs
     WHERE jobs.id = (SELECT runs.job_id FROM coordinator.runs WHERE runs.id = p_run_id)
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        outcome := 'gone';
        RETURN;
    END IF;

    UPDATE coordinator.runs
       SET status = p_status, started_at = coalesce(p_started_at, started_at),
           finished_at = p_finished_at, count = p_count, extra = p_extra,
           error_cause = p_error_cause, error_message = p_error_message,
           -- A worker's last progress snapshot is saved with the result.
           progress = coalesce(p_extra->'progress', progress)
     WHERE id = p_run_id AND status IN ('running', 'pending')
    RETURNING * INTO r;
    outcome := CASE WHEN r.id IS NULL THEN 'already' ELSE 'saved' END;

    IF r.id IS NOT NULL AND j.schedule_version = p_version
       AND (r.trigger = 'schedule'
            OR (r.scheduled_for IS NOT NULL AND j.next_run_at = r.scheduled_for)
            OR j.next_run_at <= p_finished_at) THEN
        UPDATE coordinator.jobs SET next_run_at = p_next_run_at, updated_at = now()
         WHERE id = j.id
        RETURNING * INTO j;
    END IF;

    job_id := j.id;
    paused := j.paused;
    invalid := j.invalid_reason IS NOT NULL;
    schedule_version := j.schedule_version;
    next_run_at := j.next_run_at;
END
$$;

-- At startup, before any claim: runs left pending/running by a daemon that died have an
-- unknown outcome. They become `unresolved` (cause `lost`) and block their job until an
-- operator resolves them -- unless the job is idempotent and the lost run was not itself
-- a retry, in which case it is closed as failed and one `retry` run is queued.
CREATE FUNCTION coordinator._sweep_lost(p_instance text)
RETURNS TABLE (run_id bigint, job_id bigint, action text)
LANGUAGE plpgsql AS $$
DECLARE
    r       coordinator.runs;
    j       coordinator.jobs;
    message text;
BEGIN
    FOR r IN SELECT * FROM coordinator.runs
              WHERE status IN ('pending', 'running') ORDER BY id FOR UPDATE
    LOOP
        SELECT * INTO j FROM coordinator.jobs WHERE id = r.job_id;
        message := format('lost: %s claimed it at %s and stopped before saving a result; '
                          'found by %s', coalesce(r.instance, 'an unknown instance'),
                          r.claimed_at, p_instance);
        IF j.idempotent AND r.trigger <> 'retry' THEN
            UPDATE coordinator.runs
               SET status = 'failed', error_cause = 'lost', error_message = message,
                   finished_at = now()
             WHERE id = r.id;
            INSERT INTO coordinator.runs (job_id, trigger, status, args, attempt, scheduled_for)
            VALUES (r.job_id, 'retry', 'queued', r.args, r.attempt + 1, r.scheduled_for);
            run_id := r.id; job_id := r.job_id; action := 'retried';
        ELSE
            UPDATE coordinator.runs
               SET status = 'unresolved', error_cause = 'lost', error_message = message
             WHERE id = r.id;
            run_id := r.id; job_id := r.job_id; action := 'unresolved';
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;
