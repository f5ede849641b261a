-- Attempts and retries, a per-job misfire policy, terminal outcome categories, and
-- un-pausing that forgets the old deadline whoever un-pauses (issue #13; docs/design.md,
-- "Data model", "The claim path", "Retries").
--
-- Jobs gain a retry policy (retries, retry_backoff, retry_max_delay) and a misfire policy
-- (misfire, misfire_grace). Runs gain what an attempt needs: due_at (a queued retry may
-- not start before it: a saved deadline like a job's), retry_of (the run it retries),
-- category (why a failed run failed, in seven words), retryable (what the worker or
-- command said, NULL: nothing) and exhausted (the last attempt a job's retries allowed
-- failed).
--
-- A retry is a new run, never a change of the failed one: coordinator._settle decides it
-- and inserts it in the transaction that saves the result, and returns it so the daemon
-- arms its due time without a refresh. While a retry waits, its job's saved deadline does
-- not move: the attempt that ends the chain (a success, the last failure, a run not to be
-- retried) saves the next deadline, computed from its own completion.
--
-- Redefined here (each from its latest definition, changing only what is said):
--   define_job  (0005)  retry and misfire parameters; paused NULL keeps the job's state
--                       (dropped and re-created: its signature changes)
--   sync        (0005)  passes the new fields; a job it paused for being missing is
--                       resumed when listed again, any other paused job stays paused
--                       unless the entry says paused = false
--   pause       (0001)  a job sync paused becomes an operator's pause
--   _claim      (0002)  p_now, p_skip_next: the misfire policy, and a queued retry's due
--                       time (dropped and re-created)
--   _settle     (0002)  p_category, p_retryable, p_jitter: categories and the retry
--                       decision (dropped and re-created)
--   _sweep_lost (0002)  the retry it queues links to the lost run
--   resolve     (0005)  the retry it queues links to the resolved run
--   cancel      (0005)  cancelling a waiting retry forgets the deadline its chain served
-- Every PL/pgSQL function here runs with enable_seqscan = off (see 0004_stable_plans.sql:
-- a later definition must repeat the setting). The parameters added to _claim and
-- _settle have defaults, so a caller of the old arity (0010's batches, on a database
-- that applied 0010 first) still reaches them; 0011 makes the batches pass them.

-- ---------------------------------------------------------------------------------------
-- Columns.
-- ---------------------------------------------------------------------------------------

ALTER TABLE coordinator.jobs
    ADD COLUMN retries integer NOT NULL DEFAULT 0
        CONSTRAINT jobs_retries_check CHECK (retries BETWEEN 0 AND 100),
    ADD COLUMN retry_backoff interval NOT NULL DEFAULT interval '30 seconds'
        CONSTRAINT jobs_retry_backoff_check
        CHECK (retry_backoff > interval '0' AND retry_backoff <= interval '3650 days'),
    ADD COLUMN retry_max_delay interval NOT NULL DEFAULT interval '1 hour'
        CONSTRAINT jobs_retry_max_delay_check
        CHECK (retry_max_delay > interval '0' AND retry_max_delay <= interval '3650 days'),
    ADD COLUMN misfire text NOT NULL DEFAULT 'run-once'
        CONSTRAINT jobs_misfire_check CHECK (misfire IN ('run-once', 'skip')),
    ADD COLUMN misfire_grace interval
        CONSTRAINT jobs_misfire_grace_check
        CHECK (misfire_grace >= interval '1 second' AND misfire_grace <= interval '3650 days'
               AND (misfire = 'skip') = (misfire_grace IS NOT NULL)),
    -- Paused by sync() because the namespace's declaration no longer listed it (listing
    -- it again resumes it); false for every other pause.
    ADD COLUMN sync_paused boolean NOT NULL DEFAULT false;
-- (A NULL grace passes the first two terms of its CHECK; the third ties it to 'skip'. A
-- grace under a second would only measure how fast a claim is; it also spares the daemon
-- the arithmetic of a skipped deadline's successor for every claim less than 1s late.)

ALTER TABLE coordinator.runs
    ADD COLUMN due_at timestamptz,
    ADD COLUMN retry_of bigint REFERENCES coordinator.runs (id) ON DELETE SET NULL,
    ADD COLUMN category text
        CONSTRAINT runs_category_check
        CHECK (category IN ('invalid-input', 'timeout', 'cancellation', 'external-dependency',
                            'provider-failure', 'storage', 'unknown')),
    ADD COLUMN retryable boolean,
    ADD COLUMN exhausted boolean NOT NULL DEFAULT false;

-- The chain of attempts, walked both ways (runs show), and the foreign key's own lookups
-- when runs are deleted.
CREATE INDEX runs_retry_of ON coordinator.runs (retry_of) WHERE retry_of IS NOT NULL;

-- ---------------------------------------------------------------------------------------
-- Categories: the daemon's default for a run that did not succeed, from its status and
-- cause. A worker (or a command's exit status 75) may name another; _settle writes it.
-- Every other writer (the sweep, resolve, cancel, plain SQL) gets the default from a row
-- trigger that fires only when no category was written, so the daemon's settlement never
-- pays for it.
-- ---------------------------------------------------------------------------------------

CREATE FUNCTION coordinator._category(p_status text, p_cause text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN p_status = 'timed_out' OR (p_status = 'failed' AND p_cause = 'timeout') THEN 'timeout'
        WHEN p_status = 'cancelled' THEN 'cancellation'
        WHEN p_status = 'failed' AND p_cause = 'crashed' THEN 'provider-failure'
        WHEN p_status = 'failed' THEN 'unknown'
    END
$$;

CREATE FUNCTION coordinator._runs_categorize() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off AS $$
BEGIN
    NEW.category := coordinator._category(NEW.status, NEW.error_cause);
    RETURN NEW;
END
$$;

CREATE TRIGGER runs_categorize BEFORE INSERT OR UPDATE OF status ON coordinator.runs
    FOR EACH ROW
    WHEN (NEW.category IS NULL AND NEW.status IN ('failed', 'timed_out', 'cancelled'))
    EXECUTE FUNCTION coordinator._runs_categorize();

UPDATE coordinator.runs SET category = coordinator._category(status, error_cause)
 WHERE category IS NULL AND status IN ('failed', 'timed_out', 'cancelled');

-- ---------------------------------------------------------------------------------------
-- Un-pausing forgets the old deadline, by any path (define_job, sync, resume, plain
-- UPDATE): a recurring job's deadline saved before the pause is cleared, so the daemon
-- computes the next one from now instead of running the stale one at once. A deadline
-- the same statement writes stands (it is not the old one); a one-shot job keeps its
-- instant, as resume() always did.
-- ---------------------------------------------------------------------------------------

CREATE FUNCTION coordinator._jobs_unpause() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off AS $$
BEGIN
    IF NEW.schedule_kind IN ('cron', 'interval')
       AND NEW.next_run_at IS NOT DISTINCT FROM OLD.next_run_at THEN
        NEW.next_run_at := NULL;
    END IF;
    NEW.sync_paused := false;
    RETURN NEW;
END
$$;

CREATE TRIGGER jobs_unpause BEFORE UPDATE OF paused ON coordinator.jobs
    FOR EACH ROW WHEN (OLD.paused AND NOT NEW.paused)
    EXECUTE FUNCTION coordinator._jobs_unpause();

-- As in 0001, plus: pausing a job that sync paused makes it an operator's pause (listing
-- it in the manifest again no longer resumes it).
CREATE OR REPLACE FUNCTION coordinator.pause(namespace text, name text) RETURNS void
LANGUAGE plpgsql SET enable_seqscan = off AS $$
#variable_conflict use_variable
DECLARE
    jid bigint := coordinator._job_id(namespace, name, true);
BEGIN
    UPDATE coordinator.jobs SET paused = true, sync_paused = false, updated_at = now()
     WHERE id = jid AND (NOT paused OR sync_paused);
END
$$;

-- ---------------------------------------------------------------------------------------
-- define_job: as in 0005, plus the retry and misfire policies (each NULL means its
-- default), and `paused` NULL (the default now) keeps a job's paused state; a new job is
-- not paused. Refusals name the argument in the message and in COLUMN, as 0005's do.
-- ---------------------------------------------------------------------------------------

DROP FUNCTION coordinator.define_job(text, text, jsonb, text, text, text, jsonb, interval, text,
                                     boolean, boolean, text);

CREATE FUNCTION coordinator.define_job(
    name            text,
    schedule_kind   text,
    target          jsonb,
    schedule        text DEFAULT NULL,
    namespace       text DEFAULT 'default',
    timezone        text DEFAULT 'UTC',
    params          jsonb DEFAULT '{}',
    timeout         interval DEFAULT NULL,
    priority        text DEFAULT 'background',
    idempotent      boolean DEFAULT false,
    paused          boolean DEFAULT NULL,
    invalid_reason  text DEFAULT NULL,
    retries         integer DEFAULT 0,
    retry_backoff   interval DEFAULT '30 seconds',
    retry_max_delay interval DEFAULT '1 hour',
    misfire         text DEFAULT 'run-once',
    misfire_grace   interval DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off AS $$
#variable_conflict use_variable
DECLARE
    job_id       bigint;
    once_at      timestamptz;
    reason       text := invalid_reason;
    problem      text;
    want_paused  boolean := paused;
    n_retries    integer := coalesce(retries, 0);
    backoff      interval := coalesce(retry_backoff, interval '30 seconds');
    max_delay    interval := coalesce(retry_max_delay, interval '1 hour');
    policy       text := coalesce(misfire, 'run-once');
BEGIN
    PERFORM coordinator._require(name, 'name');
    PERFORM coordinator._require(schedule_kind, 'schedule_kind');
    PERFORM coordinator._require(target, 'target');
    PERFORM coordinator._require(namespace, 'namespace');
    IF timeout <= interval '0' THEN
        RAISE EXCEPTION 'timeout: must be greater than zero'
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'timeout';
    END IF;
    IF reason IS NULL AND timeout > interval '3650 days' THEN
        RAISE EXCEPTION 'timeout: at most 3650d, not %', timeout
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'timeout';
    END IF;
    IF n_retries NOT BETWEEN 0 AND 100 THEN
        RAISE EXCEPTION 'retries: must be 0 to 100, not %', n_retries
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'retries';
    END IF;
    IF backoff <= interval '0' OR backoff > interval '3650 days' THEN
        RAISE EXCEPTION 'retry_backoff: must be greater than zero and at most 3650d, not %',
                        backoff
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'retry_backoff';
    END IF;
    IF max_delay <= interval '0' OR max_delay > interval '3650 days' THEN
        RAISE EXCEPTION 'retry_max_delay: must be greater than zero and at most 3650d, not %',
                        max_delay
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'retry_max_delay';
    END IF;
    IF policy NOT IN ('run-once', 'skip') THEN
        RAISE EXCEPTION 'misfire: must be run-once or skip, not %', policy
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'misfire';
    ELSIF policy = 'skip' AND misfire_grace IS NULL THEN
        RAISE EXCEPTION 'misfire_grace: required with misfire skip (how late a deadline may '
                        'still run, e.g. 5m)'
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'misfire_grace';
    ELSIF policy = 'run-once' AND misfire_grace IS NOT NULL THEN
        RAISE EXCEPTION 'misfire_grace: only applies with misfire skip'
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'misfire_grace';
    ELSIF misfire_grace < interval '1 second' OR misfire_grace > interval '3650 days' THEN
        RAISE EXCEPTION 'misfire_grace: must be at least 1s and at most 3650d, not %',
                        misfire_grace
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'misfire_grace';
    END IF;
    IF schedule_kind = 'interval' AND reason IS NULL THEN
        problem := coordinator._interval_problem(schedule);
        IF problem IS NOT NULL AND coordinator._duration_us(schedule) IS NULL THEN
            reason := problem;  -- not a duration: stored inert, as ever
        ELSIF problem IS NOT NULL THEN
            RAISE EXCEPTION '%', problem
                USING ERRCODE = 'invalid_parameter_value', COLUMN = 'every';
        END IF;
    END IF;
    IF schedule_kind = 'once' AND reason IS NULL THEN
        BEGIN
            once_at := schedule::timestamptz;
        EXCEPTION WHEN others THEN
            reason := format('at: %s', SQLERRM);
        END;
        IF NOT (once_at >= '1970-01-01 00:00:00+00' AND once_at < '10000-01-01 00:00:00+00') THEN
            RAISE EXCEPTION 'at: % is out of range (the years 1970 to 9999, in UTC)',
                            quote_literal(schedule)
                USING ERRCODE = 'invalid_parameter_value', COLUMN = 'at';
        END IF;
    END IF;

    INSERT INTO coordinator.jobs AS j (namespace, name, schedule_kind, schedule, timezone,
                                       target, params, timeout, priority, idempotent, paused,
                                       invalid_reason, next_run_at, retries, retry_backoff,
                                       retry_max_delay, misfire, misfire_grace)
    VALUES (namespace, name, schedule_kind, schedule,
            coalesce(timezone, 'UTC'), target, coalesce(params, '{}'), timeout,
            coalesce(priority, 'background'), coalesce(idempotent, false),
            coalesce(want_paused, false), reason, once_at, n_retries, backoff, max_delay,
            policy, misfire_grace)
    ON CONFLICT ON CONSTRAINT jobs_namespace_name_key DO UPDATE SET
        schedule_kind    = excluded.schedule_kind,
        schedule         = excluded.schedule,
        timezone         = excluded.timezone,
        target           = excluded.target,
        params           = excluded.params,
        timeout          = excluded.timeout,
        priority         = excluded.priority,
        idempotent       = excluded.idempotent,
        paused           = coalesce(want_paused, j.paused),
        invalid_reason   = excluded.invalid_reason,
        retries          = excluded.retries,
        retry_backoff    = excluded.retry_backoff,
        retry_max_delay  = excluded.retry_max_delay,
        misfire          = excluded.misfire,
        misfire_grace    = excluded.misfire_grace,
        schedule_version = CASE WHEN (j.schedule_kind, j.schedule, j.timezone)
                                     IS DISTINCT FROM
                                     (excluded.schedule_kind, excluded.schedule, excluded.timezone)
                                THEN j.schedule_version + 1 ELSE j.schedule_version END,
        next_run_at      = CASE WHEN (j.schedule_kind, j.schedule, j.timezone)
                                     IS DISTINCT FROM
                                     (excluded.schedule_kind, excluded.schedule, excluded.timezone)
                                THEN excluded.next_run_at ELSE j.next_run_at END,
        updated_at       = now()
    RETURNING j.id INTO job_id;
    RETURN job_id;
END
$$;

-- As in 0005, plus: entries may carry retries, retry_backoff, retry_max_delay, misfire and
-- misfire_grace (absent: the defaults, as every other field). `paused` absent keeps a job's
-- paused state, except that a job this function paused for being missing is resumed when
-- it is listed again (the declaration brings it back); `paused` given is applied.
CREATE OR REPLACE FUNCTION coordinator.sync(namespace text, jobs jsonb)
RETURNS TABLE (created integer, updated integer, paused integer)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
#variable_conflict use_variable
DECLARE
    previous_origin text := current_setting('coordinator.origin', true);
    entry           jsonb;
    entry_index     integer := 0;
    problem         text := coordinator._namespace_problem(namespace);
    names           text[] := '{}';
    was_sync_paused boolean;
    n_created       integer := 0;
    n_updated       integer := 0;
    n_paused        integer := 0;
BEGIN
    PERFORM coordinator._require(namespace, 'namespace');
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION '%', problem
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'namespace';
    END IF;
    IF jobs IS NULL OR jsonb_typeof(jobs) <> 'array' THEN
        RAISE EXCEPTION 'jobs must be a JSON array' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM set_config('coordinator.origin', 'quiet', true);
    FOR entry IN SELECT value FROM jsonb_array_elements(jobs) LOOP
        IF jsonb_typeof(entry) IS DISTINCT FROM 'object' THEN
            RAISE EXCEPTION 'jobs[%]: must be a JSON object', entry_index
                USING ERRCODE = 'invalid_parameter_value', COLUMN = 'jobs';
        ELSIF entry->>'name' IS NULL THEN
            RAISE EXCEPTION 'jobs[%].name: required', entry_index
                USING ERRCODE = 'invalid_parameter_value', COLUMN = 'jobs';
        END IF;
        entry_index := entry_index + 1;
        SELECT j.sync_paused INTO was_sync_paused FROM coordinator.jobs j
         WHERE j.namespace = namespace AND j.name = entry->>'name';
        IF FOUND THEN
            n_updated := n_updated + 1;
        ELSE
            n_created := n_created + 1;
        END IF;
        PERFORM coordinator.define_job(
            name            => entry->>'name',
            schedule_kind   => entry->>'schedule_kind',
            target          => entry->'target',
            schedule        => entry->>'schedule',
            namespace       => namespace,
            timezone        => coalesce(entry->>'timezone', 'UTC'),
            params          => coalesce(entry->'params', '{}'),
            timeout         => (entry->>'timeout')::interval,
            priority        => coalesce(entry->>'priority', 'background'),
            idempotent      => coalesce((entry->>'idempotent')::boolean, false),
            paused          => coalesce((entry->>'paused')::boolean,
                                        CASE WHEN was_sync_paused THEN false END),
            invalid_reason  => entry->>'invalid_reason',
            retries         => (entry->>'retries')::integer,
            retry_backoff   => (entry->>'retry_backoff')::interval,
            retry_max_delay => (entry->>'retry_max_delay')::interval,
            misfire         => entry->>'misfire',
            misfire_grace   => (entry->>'misfire_grace')::interval);
        names := names || (entry->>'name');
    END LOOP;
    UPDATE coordinator.jobs j SET paused = true, sync_paused = true, updated_at = now()
     WHERE j.namespace = namespace AND NOT j.paused AND NOT (j.name = ANY (names));
    GET DIAGNOSTICS n_paused = ROW_COUNT;
    PERFORM set_config('coordinator.origin', coalesce(previous_origin, ''), true);
    IF NOT coordinator._wakes_suppressed() THEN
        PERFORM pg_notify('coordinator', json_build_object('sync', namespace)::text);
    END IF;
    RETURN QUERY SELECT n_created, n_updated, n_paused;
END
$$;

-- ---------------------------------------------------------------------------------------
-- The claim: as in 0002, plus the job's retry and misfire policies among the columns it
-- returns (the job's definition, as rows.JOB_COLUMNS lists it), and two refusals.
--   not_due   a queued run with a due time (a retry) claimed before it: the daemon's
--             armed due time (p_scheduled_for) or, for a run offered as a manual one,
--             the daemon's clock (p_now), is earlier than the saved one (an application
--             moved it). The daemon refreshes and arms the saved time.
--   misfire   a scheduled claim of a job whose policy is `skip`, later than its grace
--             (p_now - p_scheduled_for > misfire_grace, the daemon's clock): the deadline
--             is not run; p_skip_next (the deadline computed from p_now) is saved in its
--             place and returned in next_run_at.
-- ---------------------------------------------------------------------------------------

DROP FUNCTION coordinator._claim(bigint, bigint, timestamptz, integer, text, text[], integer,
                                 integer, integer);

CREATE FUNCTION coordinator._claim(
    p_job_id        bigint,
    p_run_id        bigint,       -- the queued run of a manual or retry dispatch, NULL for a deadline
    p_scheduled_for timestamptz,  -- the armed deadline (scheduled), or the armed due time (retry)
    p_version       integer,      -- schedule_version the deadline was armed for
    p_instance      text,
    p_workers       text[],       -- worker types currently served
    p_leader_pid    integer,      -- backend pid holding the single-writer lock, or NULL
    p_lock_class    integer,
    p_lock_obj      integer,
    p_now           timestamptz DEFAULT NULL,  -- the daemon's clock (NULL: no misfire)
    p_skip_next     timestamptz DEFAULT NULL,  -- the deadline after p_now (saved if misfired)
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
    OUT next_run_at      timestamptz,
    OUT retries          integer,
    OUT retry_backoff    interval,
    OUT retry_max_delay  interval,
    OUT misfire          text,
    OUT misfire_grace    interval
)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
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
    ELSIF p_run_id IS NOT NULL AND r.due_at > coalesce(p_scheduled_for, p_now, now()) THEN
        reason := 'not_due';
    ELSIF p_run_id IS NULL AND j.schedule_version <> p_version THEN
        reason := 'version';
    ELSIF p_run_id IS NULL AND j.next_run_at IS DISTINCT FROM p_scheduled_for THEN
        -- (Not compared with now(): the daemon's clock decided the deadline is due, and a
        -- database clock a little behind must not refuse it.)
        reason := 'deadline';
    ELSIF p_run_id IS NULL AND j.misfire = 'skip' AND p_now - p_scheduled_for > j.misfire_grace THEN
        UPDATE coordinator.jobs SET next_run_at = p_skip_next, updated_at = now()
         WHERE id = j.id;
        reason := 'misfire';
        scheduled_for := p_scheduled_for;
        schedule_version := j.schedule_version;
        next_run_at := p_skip_next;
        RETURN;
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
    retries := j.retries;
    retry_backoff := j.retry_backoff;
    retry_max_delay := j.retry_max_delay;
    misfire := j.misfire;
    misfire_grace := j.misfire_grace;
END
$$;

-- ---------------------------------------------------------------------------------------
-- The settlement: as in 0002, plus the category and the retry.
--
-- A run that ends failed or timed_out is retried when its job has retries and the
-- outcome allows it: p_retryable (what the worker or command said) decides when given;
-- else every failure is retried but one whose category is invalid-input (the same input
-- would fail again). While attempts remain (attempt <= retries) a new run is queued:
-- trigger 'retry', attempt + 1, the same args and served deadline, retry_of the failed
-- run, due_at = p_finished_at + min(retry_backoff * 2^(attempt-1), retry_max_delay),
-- less up to a quarter of it (p_jitter, 0 to 1, drawn by the daemon: deterministic where
-- it is injected). Then the job's saved deadline is left as it is: the attempt that ends
-- the chain saves the next one. When no attempt remains, the run is marked exhausted and
-- the deadline is saved as for any run.
--
-- The retry comes back in retry_run_id and retry_due_at, also when the settlement is
-- sent again after a commit whose acknowledgement was lost ('already'), so the daemon
-- always arms it without a refresh.
-- ---------------------------------------------------------------------------------------

DROP FUNCTION coordinator._settle(bigint, text, timestamptz, timestamptz, bigint, jsonb, text,
                                  text, integer, timestamptz);

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
    p_category      text DEFAULT NULL,              -- NULL: the default for the status and cause
    p_retryable     boolean DEFAULT NULL,           -- NULL: the job's policy decides
    p_jitter        double precision DEFAULT NULL,  -- 0 to 1: the share of a quarter taken off
    OUT outcome          text,     -- 'saved' | 'already' | 'gone'
    OUT job_id           bigint,
    OUT paused           boolean,
    OUT invalid          boolean,
    OUT schedule_version integer,
    OUT next_run_at      timestamptz,
    OUT retry_run_id     bigint,   -- the queued retry of this run, if one waits
    OUT retry_due_at     timestamptz,
    OUT exhausted        boolean,  -- this run used the job's last attempt
    OUT category         text      -- as saved
)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
-- (OUT job_id and category share names with columns: in SQL here they mean the columns.)
#variable_conflict use_column
DECLARE
    j       coordinator.jobs;
    r       coordinator.runs;
    delay_s double precision;
BEGIN
    exhausted := false;
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
           progress = coalesce(p_extra->'progress', progress),
           category = CASE WHEN p_status <> 'succeeded'
                           THEN coalesce(p_category,
                                         coordinator._category(p_status, p_error_cause)) END,
           retryable = CASE WHEN p_status <> 'succeeded' THEN p_retryable END
     WHERE id = p_run_id AND status IN ('running', 'pending')
    RETURNING * INTO r;
    outcome := CASE WHEN r.id IS NULL THEN 'already' ELSE 'saved' END;

    IF r.id IS NULL THEN
        -- Saved before: the retry it queued then, if it still waits, is armed again.
        SELECT x.id, x.due_at INTO retry_run_id, retry_due_at FROM coordinator.runs x
         WHERE x.retry_of = p_run_id AND x.status = 'queued';
    ELSIF r.status IN ('failed', 'timed_out') AND j.retries > 0
          AND coalesce(p_retryable, r.category IS DISTINCT FROM 'invalid-input') THEN
        IF r.attempt <= j.retries THEN
            delay_s := least(extract(epoch FROM j.retry_backoff)::double precision
                             * power(2::double precision, least(r.attempt - 1, 60)),
                             extract(epoch FROM j.retry_max_delay)::double precision)
                       * (1 - 0.25 * least(greatest(coalesce(p_jitter, 0), 0), 1));
            INSERT INTO coordinator.runs AS n (job_id, trigger, status, args, attempt,
                                               scheduled_for, due_at, retry_of)
            VALUES (j.id, 'retry', 'queued', r.args, r.attempt + 1, r.scheduled_for,
                    p_finished_at + make_interval(secs => delay_s), r.id)
            ON CONFLICT (job_id) WHERE status IN ('queued', 'pending', 'running', 'unresolved')
            DO NOTHING
            RETURNING n.id, n.due_at INTO retry_run_id, retry_due_at;
        ELSE
            UPDATE coordinator.runs SET exhausted = true WHERE id = r.id;
            exhausted := true;
        END IF;
    END IF;

    IF r.id IS NOT NULL AND retry_run_id IS NULL AND j.schedule_version = p_version
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
    category := r.category;
END
$$;

-- As in 0002, plus: the retry run links to the lost run (retry_of).
CREATE OR REPLACE FUNCTION coordinator._sweep_lost(p_instance text)
RETURNS TABLE (run_id bigint, job_id bigint, action text)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
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
            INSERT INTO coordinator.runs (job_id, trigger, status, args, attempt, scheduled_for,
                                          retry_of)
            VALUES (r.job_id, 'retry', 'queued', r.args, r.attempt + 1, r.scheduled_for, r.id);
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

-- As in 0005, plus: the retry run links to the resolved run (retry_of).
CREATE OR REPLACE FUNCTION coordinator.resolve(run_id bigint, outcome text) RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off AS $$
#variable_conflict use_variable
DECLARE
    r      coordinator.runs;
    new_id bigint;
BEGIN
    IF run_id IS NULL OR outcome IS NULL THEN
        PERFORM coordinator._require(run_id, 'run_id');
        PERFORM coordinator._require(outcome, 'outcome');
    END IF;
    IF outcome NOT IN ('failed', 'succeeded', 'retry') THEN
        RAISE EXCEPTION 'outcome must be failed, succeeded or retry, not %', outcome
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO r FROM coordinator.runs WHERE id = run_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown run %', run_id
            USING ERRCODE = 'no_data_found', HINT = 'coordinator.run_not_found';
    END IF;
    IF r.status <> 'unresolved' THEN
        RAISE EXCEPTION 'run % is %, only unresolved runs can be resolved', run_id, r.status
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    UPDATE coordinator.runs
       SET status = CASE WHEN outcome = 'succeeded' THEN 'succeeded' ELSE 'failed' END,
           finished_at = coalesce(finished_at, now()),
           error_message = concat_ws('; ', error_message, 'resolved by operator as ' || outcome)
     WHERE id = run_id;
    IF outcome = 'retry' THEN
        INSERT INTO coordinator.runs (job_id, trigger, status, args, attempt, scheduled_for,
                                      retry_of)
        VALUES (r.job_id, 'retry', 'queued', r.args, r.attempt + 1, r.scheduled_for, r.id)
        RETURNING id INTO new_id;
        RETURN new_id;
    END IF;
    UPDATE coordinator.jobs SET next_run_at = NULL, updated_at = now()
     WHERE id = r.job_id AND r.scheduled_for IS NOT NULL AND next_run_at = r.scheduled_for
       AND schedule_kind IN ('cron', 'interval');
    RETURN run_id;
END
$$;

-- As in 0005, plus: cancelling a waiting retry ends its chain of attempts, so the
-- deadline the chain served is not owed any more: a recurring job's saved deadline, if
-- it is still that one, is cleared and the daemon computes the next one from now (as
-- resolve() does for a lost run), instead of running the same tick again at once.
CREATE OR REPLACE FUNCTION coordinator.cancel(run_id bigint) RETURNS void
LANGUAGE plpgsql SET enable_seqscan = off AS $$
#variable_conflict use_variable
DECLARE
    r coordinator.runs;
BEGIN
    PERFORM coordinator._require(run_id, 'run_id');
    SELECT * INTO r FROM coordinator.runs WHERE id = run_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown run %', run_id
            USING ERRCODE = 'no_data_found', HINT = 'coordinator.run_not_found';
    END IF;
    IF r.status <> 'queued' THEN
        RAISE EXCEPTION 'run % is %, only queued runs can be cancelled', run_id, r.status
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    UPDATE coordinator.runs
       SET status = 'cancelled', finished_at = now(), error_message = 'cancelled by operator'
     WHERE id = run_id;
    IF r.trigger = 'retry' AND r.scheduled_for IS NOT NULL THEN
        UPDATE coordinator.jobs SET next_run_at = NULL, updated_at = now()
         WHERE id = r.job_id AND next_run_at = r.scheduled_for
           AND schedule_kind IN ('cron', 'interval');
    END IF;
END
$$;
