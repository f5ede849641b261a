-- Recoverable runs, version 12 (issue #12): durable cursors, pause -> resume, restarts that
-- pause instead of guessing, and findings. docs/design.md, "Recoverable runs", says why.
--
-- A job may be `recoverable` (worker targets only). A run of such a job saves a cursor
-- (any JSON value, at most 16 KiB: the wire limit) and a counter as it goes, at most one
-- write every couple of seconds (the daemon coalesces them; the last one is saved with
-- the result), so a crash replays at most one such interval. Two new outstanding
-- states:
--
--   cancel_requested  an operator asked a running call to pause (pause_run); the daemon
--                     sends the worker `cancel` with reason `pause`
--   paused            the call ended at a cursor; a trigger (or a scheduled tick) of the
--                     job resumes the same run: same id, cursor and counter
--
-- Both are covered by runs_one_outstanding_per_job, rebuilt here, so no second run can
-- start beside a paused one. After a crash the start-up sweep pauses a recoverable run
-- that was running (not `unresolved`: its cursor makes a resume safe) and does not resume
-- it by itself.
--
-- Findings (kind, resource id, severity, detail) live in their own table, unique per
-- (run, kind, resource id), so a batch replayed after a crash records nothing twice; the
-- run keeps counts by severity.
--
-- (Written as 0006 beside 0007's attempts and renumbered to come after 0007 and 0010,
-- which define the same functions: each is redefined here from its latest definition.)
-- Redefined here, each changing only what this needs:
--   define_job (0007)  + recoverable (its signature changes: dropped and re-created)
--   sync       (0007)  passes an entry's recoverable on
--   trigger    (0001)  the new states are outstanding; a paused run resumes
--   cancel     (0007)  a paused run may be cancelled too
--   _claim     (0007)  resumes a paused run (a tick) and a re-queued one (a trigger);
--                      returns recoverable, cursor, count, resumes (new OUT columns:
--                      dropped and re-created)
--   _settle    (0007)  a paused outcome (no category, no retry), the cursor and findings
--                      saved with a result, a cancel_requested run settles, a recoverable
--                      job's retry continues from the cursor (two trailing parameters
--                      with defaults: dropped and re-created; callers of the old arity
--                      keep working)
--   _sweep_lost (0007) pauses recoverable runs
--   _claim_many, _claim_each (0010)  return what _claim now returns (dropped and
--                      re-created); _settle_each (0010) passes an item's cursor and
--                      findings on
-- New: pause_run, _checkpoint, _insert_findings, _add_counts.
--
-- Every PL/pgSQL function here runs with enable_seqscan = off, as 0004_stable_plans asks
-- of every function of the schema (its header says why); the plain SQL helper reads no
-- table and stays without.

-- ---------------------------------------------------------------------------------------
-- Columns, states and the findings table.
-- ---------------------------------------------------------------------------------------

ALTER TABLE coordinator.jobs
    ADD COLUMN recoverable boolean NOT NULL DEFAULT false,
    -- A command cannot hand a cursor back; an inert entry may keep what it was given.
    ADD CONSTRAINT jobs_recoverable_check
        CHECK (NOT recoverable OR target->>'kind' = 'worker' OR invalid_reason IS NOT NULL);

ALTER TABLE coordinator.runs
    DROP CONSTRAINT runs_status_check,
    ADD CONSTRAINT runs_status_check
        CHECK (status IN ('queued', 'pending', 'running', 'cancel_requested', 'paused',
                          'succeeded', 'failed', 'timed_out', 'cancelled', 'unresolved')),
    -- Where a recoverable run resumes from (NULL: from the start).
    ADD COLUMN cursor jsonb,
    -- The last checkpoint write (cursor, counter or findings) of a running call.
    ADD COLUMN last_progress_at timestamptz,
    -- When the run paused (NULL unless it is paused).
    ADD COLUMN paused_at timestamptz,
    -- How many times the run was resumed.
    ADD COLUMN resumes integer NOT NULL DEFAULT 0 CHECK (resumes >= 0),
    -- Findings recorded, by severity: {"warning": 3, "data_loss": 1}; NULL when none.
    ADD COLUMN finding_counts jsonb CHECK (jsonb_typeof(finding_counts) = 'object');

DROP INDEX coordinator.runs_one_outstanding_per_job;
CREATE UNIQUE INDEX runs_one_outstanding_per_job ON coordinator.runs (job_id)
    WHERE status IN ('queued', 'pending', 'running', 'unresolved', 'cancel_requested', 'paused');

CREATE TABLE coordinator.findings (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id      bigint NOT NULL REFERENCES coordinator.runs (id) ON DELETE CASCADE,
    kind        text NOT NULL CHECK (char_length(kind) BETWEEN 1 AND 200),
    resource_id text NOT NULL CHECK (char_length(resource_id) BETWEEN 1 AND 1000),
    severity    text NOT NULL CHECK (severity IN ('info', 'warning', 'error', 'data_loss')),
    detail      jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(detail) = 'object'),
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- A replayed batch records nothing twice.
    CONSTRAINT findings_once UNIQUE (run_id, kind, resource_id)
);
-- Pages of one run's findings, in the order they were recorded.
CREATE INDEX findings_by_run ON coordinator.findings (run_id, id);

-- ---------------------------------------------------------------------------------------
-- Findings and checkpoints: what the daemon writes while a recoverable call runs.
-- ---------------------------------------------------------------------------------------

-- Counts by severity, summed: {"warning": 2} + {"warning": 1, "error": 1}.
CREATE FUNCTION coordinator._add_counts(p_counts jsonb, p_added jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_added IS NULL THEN p_counts ELSE (
        SELECT jsonb_object_agg(key, total)
          FROM (SELECT key, sum(value::bigint) AS total
                  FROM (SELECT key, value FROM jsonb_each_text(coalesce(p_counts, '{}'))
                        UNION ALL
                        SELECT key, value FROM jsonb_each_text(p_added)) kv
                 GROUP BY key) sums) END
$$;

-- Insert a batch of findings (a JSON array of {kind, resource_id, severity, detail}) for
-- the run; those recorded before (same kind and resource id) are skipped, the first of a
-- batch wins. Returns the counts by severity of the rows actually inserted (NULL: none).
CREATE FUNCTION coordinator._insert_findings(p_run_id bigint, p_findings jsonb)
RETURNS jsonb
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    added jsonb;
BEGIN
    IF p_findings IS NULL OR jsonb_typeof(p_findings) <> 'array'
       OR jsonb_array_length(p_findings) = 0 THEN
        RETURN NULL;
    END IF;
    WITH inserted AS (
        INSERT INTO coordinator.findings AS f (run_id, kind, resource_id, severity, detail)
        SELECT p_run_id, v.kind, v.resource_id, v.severity, coalesce(v.detail, '{}')
          FROM jsonb_to_recordset(p_findings)
               AS v(kind text, resource_id text, severity text, detail jsonb)
        ON CONFLICT ON CONSTRAINT findings_once DO NOTHING
        RETURNING f.severity
    )
    SELECT jsonb_object_agg(severity, n) INTO added
      FROM (SELECT severity, count(*) AS n FROM inserted GROUP BY severity) s;
    RETURN added;
END
$$;

-- One coalesced write of a running call: its cursor (NULL: unchanged), its counter (the
-- run's total, not a delta: a write repeated after an unknown outcome changes nothing;
-- NULL: unchanged) and a batch of findings (NULL: none). Returns false, writing nothing,
-- when the run is no longer running (its result was saved, or it was removed).
CREATE FUNCTION coordinator._checkpoint(
    p_run_id   bigint,
    p_cursor   jsonb,
    p_count    bigint,
    p_findings jsonb
) RETURNS boolean
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    added jsonb;
BEGIN
    PERFORM 1 FROM coordinator.runs
      WHERE id = p_run_id AND status IN ('running', 'pending', 'cancel_requested')
        FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    added := coordinator._insert_findings(p_run_id, p_findings);
    UPDATE coordinator.runs
       SET cursor = coalesce(p_cursor, cursor),
           count = coalesce(p_count, count),
           finding_counts = coordinator._add_counts(finding_counts, added),
           last_progress_at = now()
     WHERE id = p_run_id;
    RETURN true;
END
$$;

-- ---------------------------------------------------------------------------------------
-- Pause: the operator's request, in the caller's transaction.
-- ---------------------------------------------------------------------------------------

-- Ask a run of a recoverable job to pause. A running call becomes `cancel_requested` and,
-- once the caller's transaction commits, the daemon hears {"pause": run_id} and sends the
-- worker `cancel` with reason `pause`; the worker ends the call at a cursor and the run
-- becomes `paused`. A queued run (not started, or a resume not yet claimed) is paused at
-- once. Idempotent: a run already `cancel_requested` or `paused` is left as it is.
-- Returns the run's status afterwards. Refused (object_not_in_prerequisite_state) for a
-- run of a job that is not recoverable and for a run that has finished.
CREATE FUNCTION coordinator.pause_run(run_id bigint) RETURNS text
LANGUAGE plpgsql SET enable_seqscan = off AS $$
#variable_conflict use_variable
DECLARE
    r               coordinator.runs;
    j               coordinator.jobs;
    previous_origin text := current_setting('coordinator.origin', true);
BEGIN
    PERFORM coordinator._require(run_id, 'run_id');
    SELECT * INTO r FROM coordinator.runs WHERE id = run_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown run %', run_id
            USING ERRCODE = 'no_data_found', HINT = 'coordinator.run_not_found';
    END IF;
    IF r.status IN ('cancel_requested', 'paused') THEN
        RETURN r.status;
    END IF;
    SELECT * INTO j FROM coordinator.jobs WHERE id = r.job_id;
    IF NOT j.recoverable THEN
        RAISE EXCEPTION 'run % of %/% cannot be paused: the job is not recoverable '
                        '(define it with recoverable)', run_id, j.namespace, j.name
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF r.status IN ('running', 'pending') THEN
        -- The pause payload replaces the runs trigger's wake: the daemon needs no refresh.
        PERFORM set_config('coordinator.origin', 'quiet', true);
        UPDATE coordinator.runs SET status = 'cancel_requested' WHERE id = run_id;
        PERFORM set_config('coordinator.origin', coalesce(previous_origin, ''), true);
        IF NOT coordinator._wakes_suppressed() THEN
            PERFORM pg_notify('coordinator', json_build_object('pause', run_id)::text);
        END IF;
        RETURN 'cancel_requested';
    ELSIF r.status = 'queued' THEN
        UPDATE coordinator.runs
           SET status = 'paused', paused_at = now(),
               error_message = 'paused by operator before it started'
         WHERE id = run_id;
        RETURN 'paused';
    END IF;
    RAISE EXCEPTION 'run % is %: only a running or queued run can be paused', run_id, r.status
        USING ERRCODE = 'object_not_in_prerequisite_state';
END
$$;

-- ---------------------------------------------------------------------------------------
-- The SQL API, redefined.
-- ---------------------------------------------------------------------------------------

-- As in 0007, plus `recoverable` (the signature changes: dropped and re-created). A
-- recoverable job must call a worker: a command is refused (invalid_parameter_value,
-- COLUMN recoverable), unless the entry is stored inert with an invalid_reason.
DROP FUNCTION coordinator.define_job(text, text, jsonb, text, text, text, jsonb, interval, text,
                                     boolean, boolean, text, integer, interval, interval, text,
                                     interval);

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
    misfire_grace   interval DEFAULT NULL,
    recoverable     boolean DEFAULT false
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
    IF reason IS NULL AND coalesce(recoverable, false)
       AND target->>'kind' IS DISTINCT FROM 'worker' THEN
        RAISE EXCEPTION 'recoverable: only a worker job can be recoverable (a command cannot '
                        'hand back a cursor)'
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'recoverable';
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
                                       retry_max_delay, misfire, misfire_grace, recoverable)
    VALUES (namespace, name, schedule_kind, schedule,
            coalesce(timezone, 'UTC'), target, coalesce(params, '{}'), timeout,
            coalesce(priority, 'background'), coalesce(idempotent, false),
            coalesce(want_paused, false), reason, once_at, n_retries, backoff, max_delay,
            policy, misfire_grace, coalesce(recoverable, false))
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
        recoverable      = excluded.recoverable,
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

-- As in 0007, plus: an entry's `recoverable` is passed on to define_job.
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
            misfire_grace   => (entry->>'misfire_grace')::interval,
            recoverable     => coalesce((entry->>'recoverable')::boolean, false));
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

-- As in 0001, plus: `cancel_requested` and `paused` are outstanding, and a trigger of a job
-- whose run is paused resumes that run: it is queued again (same id, cursor, counter), so
-- the daemon hears a dispatch wake and claims it as it claims any manual run. While a run
-- is running or cancel_requested, its id is returned unchanged.
CREATE OR REPLACE FUNCTION coordinator.trigger(namespace text, name text, args jsonb DEFAULT '{}')
RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off AS $$
#variable_conflict use_variable
DECLARE
    jid        bigint := coordinator._job_id(namespace, name, false);
    run_id     bigint;
    run_status text;
    tries      integer := 0;
BEGIN
    IF args IS NULL OR jsonb_typeof(args) <> 'object' THEN
        RAISE EXCEPTION 'args must be a JSON object' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    LOOP
        SELECT r.id, r.status INTO run_id, run_status FROM coordinator.runs r
         WHERE r.job_id = jid
           AND r.status IN ('queued', 'pending', 'running', 'unresolved', 'cancel_requested',
                            'paused');
        IF run_id IS NOT NULL THEN
            IF run_status = 'paused' THEN
                -- Concurrent triggers all get here; the row lock lets one of them change it.
                UPDATE coordinator.runs SET status = 'queued'
                 WHERE id = run_id AND status = 'paused';
            END IF;
            RETURN run_id;
        END IF;
        -- A concurrent trigger may insert first: ON CONFLICT waits for it, and the next
        -- iteration's fresh snapshot sees its run.
        INSERT INTO coordinator.runs (job_id, trigger, status, args)
        VALUES (jid, 'manual', 'queued', args)
        ON CONFLICT (job_id)
           WHERE status IN ('queued', 'pending', 'running', 'unresolved', 'cancel_requested',
                            'paused')
        DO NOTHING
        RETURNING id INTO run_id;
        IF run_id IS NOT NULL THEN
            RETURN run_id;
        END IF;
        tries := tries + 1;
        IF tries >= 3 THEN
            -- Only a snapshot that cannot see the committed conflicting run gets here
            -- (REPEATABLE READ or SERIALIZABLE callers); let them retry the transaction.
            RAISE EXCEPTION 'concurrent trigger of %/%; retry the transaction', namespace, name
                USING ERRCODE = 'serialization_failure';
        END IF;
    END LOOP;
END
$$;

-- As in 0007, plus: a paused run may be cancelled too (the job is free again; the next
-- trigger starts afresh).
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
    IF r.status NOT IN ('queued', 'paused') THEN
        RAISE EXCEPTION 'run % is %, only queued or paused runs can be cancelled', run_id, r.status
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    UPDATE coordinator.runs
       SET status = 'cancelled', finished_at = now(), paused_at = NULL,
           error_message = 'cancelled by operator'
     WHERE id = run_id;
    IF r.trigger = 'retry' AND r.scheduled_for IS NOT NULL THEN
        UPDATE coordinator.jobs SET next_run_at = NULL, updated_at = now()
         WHERE id = r.job_id AND next_run_at = r.scheduled_for
           AND schedule_kind IN ('cron', 'interval');
    END IF;
END
$$;

-- ---------------------------------------------------------------------------------------
-- The daemon's functions, redefined.
-- ---------------------------------------------------------------------------------------

-- As in 0007, plus: a scheduled claim of a job whose run is paused resumes that run
-- instead of refusing it as `outstanding` (for a long scan an interval means "check every
-- N whether a run needs starting"); a queued run that ran before (a trigger's resume)
-- keeps its first start; and the claim returns what a resumed call needs: whether the job
-- is recoverable, the run's cursor and counter, and how often it was resumed. Resuming
-- clears the pause's time and reason. (New OUT columns: dropped and re-created.)
DROP FUNCTION coordinator._claim(bigint, bigint, timestamptz, integer, text, text[], integer,
                                 integer, integer, timestamptz, timestamptz);

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
    OUT misfire_grace    interval,
    OUT recoverable      boolean,
    OUT cursor           jsonb,
    OUT count            bigint,
    OUT resumes          integer
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
        -- A queued run that started before is a resume (a trigger of a paused run): it
        -- keeps its first start.
        UPDATE coordinator.runs
           SET status = 'running', claimed_at = now(), started_at = coalesce(started_at, now()),
               instance = p_instance, schedule_version = j.schedule_version,
               resumes = runs.resumes + CASE WHEN runs.started_at IS NULL THEN 0 ELSE 1 END,
               paused_at = NULL, error_cause = NULL, error_message = NULL
         WHERE id = p_run_id
        RETURNING * INTO r;
    ELSE
        SELECT * INTO r FROM coordinator.runs
         WHERE job_id = j.id AND status = 'paused' FOR UPDATE;
        IF FOUND THEN
            -- The tick resumes the paused run; it serves this deadline now.
            UPDATE coordinator.runs
               SET status = 'running', claimed_at = now(), instance = p_instance,
                   schedule_version = j.schedule_version, scheduled_for = p_scheduled_for,
                   resumes = runs.resumes + 1, paused_at = NULL, error_cause = NULL,
                   error_message = NULL
             WHERE id = r.id
            RETURNING * INTO r;
        ELSE
            INSERT INTO coordinator.runs (job_id, trigger, status, scheduled_for, claimed_at,
                                          started_at, schedule_version, instance)
            VALUES (j.id, 'schedule', 'running', p_scheduled_for, now(), now(),
                    j.schedule_version, p_instance)
            ON CONFLICT (job_id)
               WHERE status IN ('queued', 'pending', 'running', 'unresolved', 'cancel_requested',
                                'paused')
            DO NOTHING
            RETURNING * INTO r;
            IF r.id IS NULL THEN
                reason := 'outstanding';
                RETURN;
            END IF;
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
    recoverable := j.recoverable;
    cursor := r.cursor;
    count := r.count;
    resumes := r.resumes;
END
$$;

-- As in 0007, plus: a `cancel_requested` run settles too; a `paused` outcome leaves the
-- run outstanding with no finish time (paused_at instead; the reason is in error_message),
-- no category and no retry; a resumed run keeps its first start; p_cursor (NULL:
-- unchanged) is the cursor saved with the result, p_findings (NULL: none) the findings not
-- yet written when the call ended, recorded idempotently like the daemon's checkpoint
-- writes; a recoverable job's retry starts from the failed run's cursor and counter.
DROP FUNCTION coordinator._settle(bigint, text, timestamptz, timestamptz, bigint, jsonb, text,
                                  text, integer, timestamptz, text, boolean, double precision);

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
    p_cursor        jsonb DEFAULT NULL,             -- the cursor saved with it (NULL: unchanged)
    p_findings      jsonb DEFAULT NULL,             -- findings not written yet (NULL: none)
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
    added   jsonb;
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
       SET status = p_status,
           -- A resumed run keeps its first start.
           started_at = CASE WHEN resumes > 0 THEN started_at
                             ELSE coalesce(p_started_at, started_at) END,
           -- A paused run is not finished: it has paused_at instead.
           finished_at = CASE WHEN p_status = 'paused' THEN NULL ELSE p_finished_at END,
           paused_at = CASE WHEN p_status = 'paused' THEN p_finished_at END,
           count = p_count, extra = p_extra,
           error_cause = p_error_cause, error_message = p_error_message,
           -- A worker's last progress snapshot is saved with the result.
           progress = coalesce(p_extra->'progress', progress),
           category = CASE WHEN p_status NOT IN ('succeeded', 'paused')
                           THEN coalesce(p_category,
                                         coordinator._category(p_status, p_error_cause)) END,
           retryable = CASE WHEN p_status NOT IN ('succeeded', 'paused') THEN p_retryable END,
           cursor = coalesce(p_cursor, cursor),
           last_progress_at = CASE WHEN p_cursor IS NULL THEN last_progress_at
                                   ELSE p_finished_at END
     WHERE id = p_run_id AND status IN ('running', 'pending', 'cancel_requested')
    RETURNING * INTO r;
    outcome := CASE WHEN r.id IS NULL THEN 'already' ELSE 'saved' END;

    IF r.id IS NOT NULL AND p_findings IS NOT NULL THEN
        added := coordinator._insert_findings(p_run_id, p_findings);
        IF added IS NOT NULL THEN
            UPDATE coordinator.runs
               SET finding_counts = coordinator._add_counts(finding_counts, added)
             WHERE id = p_run_id;
        END IF;
    END IF;

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
            -- A recoverable job's retry goes on from the failed run's cursor and counter.
            INSERT INTO coordinator.runs AS n (job_id, trigger, status, args, attempt,
                                               scheduled_for, due_at, retry_of, cursor, count)
            VALUES (j.id, 'retry', 'queued', r.args, r.attempt + 1, r.scheduled_for,
                    p_finished_at + make_interval(secs => delay_s), r.id,
                    CASE WHEN j.recoverable THEN r.cursor END,
                    CASE WHEN j.recoverable THEN r.count END)
            ON CONFLICT (job_id)
               WHERE status IN ('queued', 'pending', 'running', 'unresolved', 'cancel_requested',
                                'paused')
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

-- As in 0007, plus: a run of a recoverable job left running (or cancel_requested) by a
-- daemon that died is `paused` with the reason, not `unresolved`: its cursor makes a
-- resume safe. It is not resumed by this start: if it served the job's saved deadline,
-- that deadline is cleared (the daemon computes the next one from now), so no overdue
-- tick resumes it at once; a trigger, or the next tick, does.
CREATE OR REPLACE FUNCTION coordinator._sweep_lost(p_instance text)
RETURNS TABLE (run_id bigint, job_id bigint, action text)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    r       coordinator.runs;
    j       coordinator.jobs;
    message text;
BEGIN
    FOR r IN SELECT * FROM coordinator.runs
              WHERE status IN ('pending', 'running', 'cancel_requested') ORDER BY id FOR UPDATE
    LOOP
        SELECT * INTO j FROM coordinator.jobs WHERE id = r.job_id;
        IF j.recoverable OR r.status = 'cancel_requested' THEN
            UPDATE coordinator.runs
               SET status = 'paused', paused_at = now(), error_cause = NULL,
                   error_message = format('daemon restart mid-run: %s claimed it at %s and '
                                          'stopped; paused at its last saved cursor by %s',
                                          coalesce(r.instance, 'an unknown instance'),
                                          r.claimed_at, p_instance)
             WHERE id = r.id;
            UPDATE coordinator.jobs SET next_run_at = NULL, updated_at = now()
             WHERE id = j.id AND r.scheduled_for IS NOT NULL AND next_run_at = r.scheduled_for
               AND schedule_kind <> 'manual';
            run_id := r.id; job_id := r.job_id; action := 'paused';
            RETURN NEXT;
            CONTINUE;
        END IF;
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


-- ---------------------------------------------------------------------------------------
-- The batches (0010): they carry what _claim and _settle now take and return.
-- ---------------------------------------------------------------------------------------

DROP FUNCTION coordinator._claim_many(text, text, text[], integer, integer, integer);
DROP FUNCTION coordinator._claim_each(json, text, text[], boolean);

-- As in 0010, plus recoverable, cursor, count and resumes among the columns.
CREATE FUNCTION coordinator._claim_many(
    p_items      text,      -- [{"i": index, "job": id, "run": id|null, "at": ts|null, "v": n|null,
                            --   "now": ts, "skip": ts|null}]
    p_instance   text,
    p_workers    text[],
    p_leader_pid integer,
    p_lock_class integer,
    p_lock_obj   integer
) RETURNS TABLE (
    i                integer,
    err_state        text,
    err_message      text,
    reason           text,
    run_id           bigint,
    trigger          text,
    args             jsonb,
    attempt          integer,
    scheduled_for    timestamptz,
    claimed_at       timestamptz,
    namespace        text,
    name             text,
    schedule_kind    text,
    schedule         text,
    timezone         text,
    target           jsonb,
    params           jsonb,
    timeout          interval,
    priority         text,
    idempotent       boolean,
    schedule_version integer,
    next_run_at      timestamptz,
    retries          integer,
    retry_backoff    interval,
    retry_max_delay  interval,
    misfire          text,
    misfire_grace    interval,
    recoverable      boolean,
    cursor           jsonb,
    count            bigint,
    resumes          integer
)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    items json := p_items::json;
BEGIN
    -- Fencing once for the batch (each item would otherwise scan pg_locks again).
    IF p_leader_pid IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM pg_locks l
         WHERE l.locktype = 'advisory' AND l.pid = p_leader_pid AND l.granted
           AND l.classid = p_lock_class::oid AND l.objid = p_lock_obj::oid AND l.objsubid = 2
    ) THEN
        RETURN QUERY SELECT x.i, NULL::text, NULL::text, 'fenced'::text, NULL::bigint,
                            NULL::text, NULL::jsonb, NULL::integer, NULL::timestamptz,
                            NULL::timestamptz, NULL::text, NULL::text, NULL::text, NULL::text,
                            NULL::text, NULL::jsonb, NULL::jsonb, NULL::interval, NULL::text,
                            NULL::boolean, NULL::integer, NULL::timestamptz,
                            NULL::integer, NULL::interval, NULL::interval, NULL::text,
                            NULL::interval, NULL::boolean, NULL::jsonb, NULL::bigint,
                            NULL::integer
                       FROM json_to_recordset(items) AS x(i integer);
        RETURN;
    END IF;
    -- Optimistically, the whole batch in one go; if any item fails, the batch is rolled
    -- back to here and done again item by item, each in a subtransaction of its own
    -- (a subtransaction per item costs more than the batch: only pay it when needed).
    BEGIN
        RETURN QUERY SELECT * FROM coordinator._claim_each(items, p_instance, p_workers, false);
    EXCEPTION WHEN others THEN
        RETURN QUERY SELECT * FROM coordinator._claim_each(items, p_instance, p_workers, true);
    END;
END
$$;

-- The loop of _claim_many: each item as coordinator._claim handles it (fencing done
-- by the caller); with p_isolate, each item in a subtransaction so that an item that
-- fails comes back with its error and the others are claimed.
CREATE FUNCTION coordinator._claim_each(
    p_items     json,
    p_instance  text,
    p_workers   text[],
    p_isolate   boolean
) RETURNS TABLE (
    i                integer,
    err_state        text,
    err_message      text,
    reason           text,
    run_id           bigint,
    trigger          text,
    args             jsonb,
    attempt          integer,
    scheduled_for    timestamptz,
    claimed_at       timestamptz,
    namespace        text,
    name             text,
    schedule_kind    text,
    schedule         text,
    timezone         text,
    target           jsonb,
    params           jsonb,
    timeout          interval,
    priority         text,
    idempotent       boolean,
    schedule_version integer,
    next_run_at      timestamptz,
    retries          integer,
    retry_backoff    interval,
    retry_max_delay  interval,
    misfire          text,
    misfire_grace    interval,
    recoverable      boolean,
    cursor           jsonb,
    count            bigint,
    resumes          integer
)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    item record;
    c    record;
BEGIN
    FOR item IN
        SELECT * FROM json_to_recordset(p_items)
                   AS x(i integer, job bigint, run bigint, at timestamptz, v integer,
                        now timestamptz, skip timestamptz)
         ORDER BY x.job, x.i
    LOOP
        i := item.i;
        err_state := NULL;
        err_message := NULL;
        IF p_isolate THEN
            BEGIN
                SELECT * INTO c FROM coordinator._claim(item.job, item.run, item.at, item.v,
                                                        p_instance, p_workers, NULL, 0, 0,
                                                        item.now, item.skip);
            EXCEPTION WHEN others THEN
                err_state := SQLSTATE;
                err_message := SQLERRM;
                reason := NULL; run_id := NULL;
                RETURN NEXT;
                CONTINUE;
            END;
        ELSE
            SELECT * INTO c FROM coordinator._claim(item.job, item.run, item.at, item.v,
                                                    p_instance, p_workers, NULL, 0, 0,
                                                    item.now, item.skip);
        END IF;
        reason := c.reason; run_id := c.run_id; trigger := c.trigger; args := c.args;
        attempt := c.attempt; scheduled_for := c.scheduled_for;
        claimed_at := c.claimed_at; namespace := c.namespace; name := c.name;
        schedule_kind := c.schedule_kind; schedule := c.schedule;
        timezone := c.timezone; target := c.target; params := c.params;
        timeout := c.timeout; priority := c.priority; idempotent := c.idempotent;
        schedule_version := c.schedule_version; next_run_at := c.next_run_at;
        retries := c.retries; retry_backoff := c.retry_backoff;
        retry_max_delay := c.retry_max_delay; misfire := c.misfire;
        misfire_grace := c.misfire_grace; recoverable := c.recoverable; cursor := c.cursor;
        count := c.count; resumes := c.resumes;
        RETURN NEXT;
    END LOOP;
END
$$;

-- As in 0010, plus: an item's "cursor" ({"v": value}: the wrapper keeps a cursor that is
-- JSON null apart from "no cursor") and "findings" (an array) go to _settle.
CREATE OR REPLACE FUNCTION coordinator._settle_each(p_items json, p_isolate boolean) RETURNS TABLE (
    i                integer,
    err_state        text,
    err_message      text,
    outcome          text,
    job_id           bigint,
    paused           boolean,
    invalid          boolean,
    schedule_version integer,
    next_run_at      timestamptz,
    retry_run_id     bigint,
    retry_due_at     timestamptz,
    exhausted        boolean,
    category         text
)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    item record;
    s    record;
BEGIN
    FOR item IN
        SELECT x.*, r.job_id AS job
          FROM json_to_recordset(p_items)
               AS x(i integer, run bigint, status text, started timestamptz,
                    finished timestamptz, count bigint, extra jsonb, cause text,
                    message text, v integer, next timestamptz, category text,
                    retryable boolean, jitter double precision, cursor jsonb, findings jsonb)
          LEFT JOIN coordinator.runs r ON r.id = x.run
         ORDER BY r.job_id, x.i
    LOOP
        i := item.i;
        err_state := NULL;
        err_message := NULL;
        IF p_isolate THEN
            BEGIN
                SELECT * INTO s FROM coordinator._settle(item.run, item.status, item.started,
                                                         item.finished, item.count, item.extra,
                                                         item.cause, item.message, item.v,
                                                         item.next, item.category,
                                                         item.retryable, item.jitter,
                                                         item.cursor -> 'v', item.findings);
            EXCEPTION WHEN others THEN
                err_state := SQLSTATE;
                err_message := SQLERRM;
                outcome := NULL;
                RETURN NEXT;
                CONTINUE;
            END;
        ELSE
            SELECT * INTO s FROM coordinator._settle(item.run, item.status, item.started,
                                                     item.finished, item.count, item.extra,
                                                     item.cause, item.message, item.v,
                                                     item.next, item.category,
                                                     item.retryable, item.jitter,
                                                     item.cursor -> 'v', item.findings);
        END IF;
        outcome := s.outcome; job_id := s.job_id; paused := s.paused;
        invalid := s.invalid; schedule_version := s.schedule_version;
        next_run_at := s.next_run_at;
        retry_run_id := s.retry_run_id; retry_due_at := s.retry_due_at;
        exhausted := s.exhausted; category := s.category;
        RETURN NEXT;
    END LOOP;
END
$$;
