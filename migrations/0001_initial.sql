-- coordinator schema, version 1: jobs, runs, wake triggers and the SQL API.
--
-- Applied by `coordinator migrate` inside one transaction under an advisory lock.
-- Status and kind columns are text with CHECK constraints rather than enums: a client
-- that meets an enum for the first time introspects its type, which is SQL the daemon
-- would otherwise send on its first claim.

CREATE TABLE coordinator.jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    namespace        text NOT NULL DEFAULT 'default' CHECK (namespace <> ''),
    name             text NOT NULL CHECK (name <> ''),
    schedule_kind    text NOT NULL CHECK (schedule_kind IN ('cron', 'interval', 'once', 'manual')),
    schedule         text CHECK ((schedule_kind = 'manual') = (schedule IS NULL)),
    timezone         text NOT NULL DEFAULT 'UTC',
    target           jsonb NOT NULL CHECK (jsonb_typeof(target) = 'object'),
    params           jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(params) = 'object'),
    timeout          interval CHECK (timeout > interval '0'),
    priority         text NOT NULL DEFAULT 'background'
                     CHECK (priority IN ('interactive', 'background')),
    idempotent       boolean NOT NULL DEFAULT false,
    paused           boolean NOT NULL DEFAULT false,
    invalid_reason   text,
    next_run_at      timestamptz,
    schedule_version integer NOT NULL DEFAULT 1,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (namespace, name)
);

CREATE TABLE coordinator.runs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id           bigint NOT NULL REFERENCES coordinator.jobs (id) ON DELETE CASCADE,
    trigger          text NOT NULL CHECK (trigger IN ('schedule', 'manual', 'retry')),
    status           text NOT NULL CHECK (status IN ('queued', 'pending', 'running', 'succeeded',
                                                     'failed', 'timed_out', 'cancelled',
                                                     'unresolved')),
    scheduled_for    timestamptz,
    claimed_at       timestamptz,
    started_at       timestamptz,
    finished_at      timestamptz,
    schedule_version integer,
    instance         text,
    args             jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(args) = 'object'),
    count            bigint,
    extra            jsonb,
    error_cause      text CHECK (error_cause IN ('handler', 'timeout', 'crashed', 'lost')),
    error_message    text,
    attempt          integer NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    progress         jsonb,
    created_at       timestamptz NOT NULL DEFAULT now()
);

-- The load-bearing invariant: at most one outstanding run per job, whatever races.
CREATE UNIQUE INDEX runs_one_outstanding_per_job ON coordinator.runs (job_id)
    WHERE status IN ('queued', 'pending', 'running', 'unresolved');
CREATE INDEX runs_by_job ON coordinator.runs (job_id, id DESC);

-- ---------------------------------------------------------------------------------------
-- Wakes. PostgreSQL delivers NOTIFY at commit, drops it on rollback (also of the
-- savepoint that raised it), and folds identical payloads within a transaction. The
-- triggers are per statement, so a 1,000-row UPDATE raises one notification.
--
-- Sessions that set coordinator.origin = 'daemon' (the daemon's own connections) raise
-- none: the daemon needs no wake for its own writes, and a committing transaction with
-- a pending NOTIFY takes a cluster-wide lock. The SQL API's sync() sets it to 'quiet'
-- for its own statements and sends one wake itself.
-- ---------------------------------------------------------------------------------------

CREATE FUNCTION coordinator._wakes_suppressed() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce(current_setting('coordinator.origin', true), '') IN ('daemon', 'quiet')
$$;

CREATE FUNCTION coordinator._jobs_wake() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
BEGIN
    IF coordinator._wakes_suppressed() THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' THEN
        SELECT array_agg(id) INTO ids FROM (SELECT DISTINCT id FROM old_rows LIMIT 2) s;
    ELSE
        SELECT array_agg(id) INTO ids FROM (SELECT DISTINCT id FROM new_rows LIMIT 2) s;
    END IF;
    IF ids IS NULL THEN
        RETURN NULL;  -- the statement touched no row
    ELSIF cardinality(ids) = 1 THEN
        PERFORM pg_notify('coordinator', json_build_object('job', ids[1])::text);
    ELSE
        PERFORM pg_notify('coordinator', '{"jobs": "many"}');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_wake_insert AFTER INSERT ON coordinator.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION coordinator._jobs_wake();
CREATE TRIGGER jobs_wake_update AFTER UPDATE ON coordinator.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION coordinator._jobs_wake();
CREATE TRIGGER jobs_wake_delete AFTER DELETE ON coordinator.jobs
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION coordinator._jobs_wake();

CREATE FUNCTION coordinator._runs_wake() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
    queued boolean;
BEGIN
    IF coordinator._wakes_suppressed() THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' THEN
        SELECT array_agg(id), bool_and(false) INTO ids, queued
          FROM (SELECT id FROM old_rows LIMIT 2) s;
    ELSE
        SELECT array_agg(id), bool_and(status = 'queued') INTO ids, queued
          FROM (SELECT id, status FROM new_rows LIMIT 2) s;
    END IF;
    IF ids IS NULL THEN
        RETURN NULL;
    ELSIF cardinality(ids) = 1 AND queued THEN
        -- A manual dispatch: the daemon claims it directly, without waiting for a refresh.
        -- The job's priority and worker type come along so that admission can order it
        -- and check availability without a query.
        PERFORM pg_notify('coordinator', json_build_object(
                    'run', ids[1], 'dispatch', true, 'job', j.id, 'priority', j.priority,
                    'worker', CASE WHEN j.target->>'kind' = 'worker'
                                   THEN j.target->>'type' END)::text)
           FROM coordinator.runs r JOIN coordinator.jobs j ON j.id = r.job_id
          WHERE r.id = ids[1];
    ELSIF cardinality(ids) = 1 THEN
        PERFORM pg_notify('coordinator', json_build_object('run', ids[1])::text);
    ELSE
        PERFORM pg_notify('coordinator', '{"runs": "many"}');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER runs_wake_insert AFTER INSERT ON coordinator.runs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION coordinator._runs_wake();
CREATE TRIGGER runs_wake_update AFTER UPDATE ON coordinator.runs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION coordinator._runs_wake();
CREATE TRIGGER runs_wake_delete AFTER DELETE ON coordinator.runs
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION coordinator._runs_wake();

-- ---------------------------------------------------------------------------------------
-- SQL API: for applications in any language, inside their own transactions. The wake
-- reaches the daemon when (and only if) the caller's outer transaction commits.
-- ---------------------------------------------------------------------------------------

CREATE FUNCTION coordinator._job_id(p_namespace text, p_name text, p_lock boolean)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    found_id bigint;
BEGIN
    IF p_lock THEN
        SELECT id INTO found_id FROM coordinator.jobs
         WHERE namespace = p_namespace AND name = p_name FOR NO KEY UPDATE;
    ELSE
        SELECT id INTO found_id FROM coordinator.jobs
         WHERE namespace = p_namespace AND name = p_name;
    END IF;
    IF found_id IS NULL THEN
        RAISE EXCEPTION 'unknown job %/%', p_namespace, p_name
            USING ERRCODE = 'no_data_found', HINT = 'coordinator.job_not_found';
    END IF;
    RETURN found_id;
END
$$;

-- Upsert a job by (namespace, name). A changed schedule (kind, expression or timezone)
-- bumps schedule_version and clears next_run_at, so the daemon computes the new deadline
-- afresh; a one-shot job's deadline is its instant, which SQL can read, so it is set here.
-- The SQL layer cannot parse cron: an unparsable expression is stored and the daemon marks
-- the job inert with invalid_reason (the CLI validates before writing; invalid_reason may
-- also be given directly, as `coordinator sync` does for entries it rejects).
CREATE FUNCTION coordinator.define_job(
    name           text,
    schedule_kind  text,
    target         jsonb,
    schedule       text DEFAULT NULL,
    namespace      text DEFAULT 'default',
    timezone       text DEFAULT 'UTC',
    params         jsonb DEFAULT '{}',
    timeout        interval DEFAULT NULL,
    priority       text DEFAULT 'background',
    idempotent     boolean DEFAULT false,
    paused         boolean DEFAULT false,
    invalid_reason text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    job_id       bigint;
    once_at      timestamptz;
    reason       text := invalid_reason;
BEGIN
    IF schedule_kind = 'once' AND reason IS NULL THEN
        BEGIN
            once_at := schedule::timestamptz;
        EXCEPTION WHEN others THEN
            reason := format('at: %s', SQLERRM);
        END;
    END IF;

    INSERT INTO coordinator.jobs AS j (namespace, name, schedule_kind, schedule, timezone,
                                       target, params, timeout, priority, idempotent, paused,
                                       invalid_reason, next_run_at)
    VALUES (coalesce(namespace, 'default'), name, schedule_kind, schedule,
            coalesce(timezone, 'UTC'), target, coalesce(params, '{}'), timeout,
            coalesce(priority, 'background'), coalesce(idempotent, false),
            coalesce(paused, false), reason, once_at)
    ON CONFLICT ON CONSTRAINT jobs_namespace_name_key DO UPDATE SET
        schedule_kind    = excluded.schedule_kind,
        schedule         = excluded.schedule,
        timezone         = excluded.timezone,
        target           = excluded.target,
        params           = excluded.params,
        timeout          = excluded.timeout,
        priority         = excluded.priority,
        idempotent       = excluded.idempotent,
        paused           = excluded.paused,
        invalid_reason   = excluded.invalid_reason,
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

-- Ask for a run now. Returns the new queued run's id, or the id of the run that is
-- already outstanding for the job (queued, pending, running or unresolved): triggering
-- is idempotent while a run is outstanding.
CREATE FUNCTION coordinator.trigger(namespace text, name text, args jsonb DEFAULT '{}')
RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    jid    bigint := coordinator._job_id(namespace, name, false);
    run_id bigint;
    tries  integer := 0;
BEGIN
    IF args IS NULL OR jsonb_typeof(args) <> 'object' THEN
        RAISE EXCEPTION 'args must be a JSON object' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    LOOP
        SELECT r.id INTO run_id FROM coordinator.runs r
         WHERE r.job_id = jid AND r.status IN ('queued', 'pending', 'running', 'unresolved');
        IF run_id IS NOT NULL THEN
            RETURN run_id;
        END IF;
        -- A concurrent trigger may insert first: ON CONFLICT waits for it, and the next
        -- iteration's fresh snapshot sees its run.
        INSERT INTO coordinator.runs (job_id, trigger, status, args)
        VALUES (jid, 'manual', 'queued', args)
        ON CONFLICT (job_id) WHERE status IN ('queued', 'pending', 'running', 'unresolved')
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

-- (Each function looks the job up once, into a variable: a function call in a WHERE
-- clause would run again for every row scanned.)
CREATE FUNCTION coordinator.pause(namespace text, name text) RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    jid bigint := coordinator._job_id(namespace, name, true);
BEGIN
    UPDATE coordinator.jobs SET paused = true, updated_at = now() WHERE id = jid AND NOT paused;
END
$$;

-- Resuming a recurring job forgets the deadline saved before the pause: ticks that fell
-- inside the pause are not owed. A one-shot job keeps its instant.
CREATE FUNCTION coordinator.resume(namespace text, name text) RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    jid bigint := coordinator._job_id(namespace, name, true);
BEGIN
    UPDATE coordinator.jobs
       SET paused = false,
           next_run_at = CASE WHEN schedule_kind IN ('cron', 'interval') THEN NULL
                              ELSE next_run_at END,
           updated_at = now()
     WHERE id = jid AND paused;
END
$$;

-- Remove a job and its run history. A call still running settles into nothing.
CREATE FUNCTION coordinator.remove(namespace text, name text) RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    jid bigint := coordinator._job_id(namespace, name, true);
BEGIN
    DELETE FROM coordinator.jobs WHERE id = jid;
END
$$;

-- Declare the complete job set of one namespace. `jobs` is a JSON array of objects with
-- the define_job argument names (name, schedule_kind, schedule, target, timezone, params,
-- timeout, priority, idempotent, paused, invalid_reason). Jobs of the namespace that the
-- array does not name are paused (their history is kept); an empty array pauses them all.
-- One wake, {"sync": namespace}, whatever the number of jobs.
CREATE FUNCTION coordinator.sync(namespace text, jobs jsonb) RETURNS TABLE (created integer,
                                                                          updated integer,
                                                                          paused integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    previous_origin text := current_setting('coordinator.origin', true);
    entry           jsonb;
    names           text[] := '{}';
    n_created       integer := 0;
    n_updated       integer := 0;
    n_paused        integer := 0;
BEGIN
    IF jobs IS NULL OR jsonb_typeof(jobs) <> 'array' THEN
        RAISE EXCEPTION 'jobs must be a JSON array' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM set_config('coordinator.origin', 'quiet', true);
    FOR entry IN SELECT value FROM jsonb_array_elements(jobs) LOOP
        IF EXISTS (SELECT 1 FROM coordinator.jobs j
                    WHERE j.namespace = namespace AND j.name = entry->>'name') THEN
            n_updated := n_updated + 1;
        ELSE
            n_created := n_created + 1;
        END IF;
        PERFORM coordinator.define_job(
            name           => entry->>'name',
            schedule_kind  => entry->>'schedule_kind',
            target         => entry->'target',
            schedule       => entry->>'schedule',
            namespace      => namespace,
            timezone       => coalesce(entry->>'timezone', 'UTC'),
            params         => coalesce(entry->'params', '{}'),
            timeout        => (entry->>'timeout')::interval,
            priority       => coalesce(entry->>'priority', 'background'),
            idempotent     => coalesce((entry->>'idempotent')::boolean, false),
            paused         => coalesce((entry->>'paused')::boolean, false),
            invalid_reason => entry->>'invalid_reason');
        names := names || (entry->>'name');
    END LOOP;
    UPDATE coordinator.jobs j SET paused = true, updated_at = now()
     WHERE j.namespace = namespace AND NOT j.paused AND NOT (j.name = ANY (names));
    GET DIAGNOSTICS n_paused = ROW_COUNT;
    PERFORM set_config('coordinator.origin', coalesce(previous_origin, ''), true);
    IF NOT coordinator._wakes_suppressed() THEN
        PERFORM pg_notify('coordinator', json_build_object('sync', namespace)::text);
    END IF;
    RETURN QUERY SELECT n_created, n_updated, n_paused;
END
$$;

-- Settle an unresolved run by an operator's word. 'failed' and 'succeeded' close it; if it
-- consumed the job's saved deadline, that deadline is cleared so the daemon computes the
-- next one from now instead of running the lost tick again. 'retry' closes it as failed
-- and queues one new run (trigger 'retry', attempt + 1) with the same args.
-- Returns the id of the run that now represents the work (the retry run, or the same run).
CREATE FUNCTION coordinator.resolve(run_id bigint, outcome text) RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    r      coordinator.runs;
    new_id bigint;
BEGIN
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
        INSERT INTO coordinator.runs (job_id, trigger, status, args, attempt, scheduled_for)
        VALUES (r.job_id, 'retry', 'queued', r.args, r.attempt + 1, r.scheduled_for)
        RETURNING id INTO new_id;
        RETURN new_id;
    END IF;
    UPDATE coordinator.jobs SET next_run_at = NULL, updated_at = now()
     WHERE id = r.job_id AND r.scheduled_for IS NOT NULL AND next_run_at = r.scheduled_for
       AND schedule_kind IN ('cron', 'interval');
    RETURN run_id;
END
$$;
