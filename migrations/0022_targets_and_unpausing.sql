-- Front doors, found by a new user's first hour (2026-12-01):
--
-- 1. Targets checked. define_job stored any JSON object as a job's target, so
--    `{"kind": "shell", ...}` or an exec target without argv was listed active and failed
--    only when it ran ("bad target: ..."), while the CLI, the Python client, a manifest and
--    a worker's declaration all refuse it. Now define_job (and sync, which calls it)
--    refuses it too, in the words of coordinator.model.Target.from_json, naming the
--    argument (SQLSTATE 22023, COLUMN 'target'). An entry stored inert on purpose
--    (invalid_reason given: a manifest's entry with problems) keeps any object, as
--    before. Plain INSERT/UPDATE is not checked: a CHECK constraint would run on every
--    update of the row (0005 explains why the jobs table has none that costs); the
--    executors still refuse such a target when it runs.
--
-- 2. Un-pausing dispatches. A run triggered while its job was paused is queued; the
--    claim refuses it while the job is paused. Un-pausing the job let only the jobs wake
--    trigger speak (a coalesced refresh: "something about job N changed"), so the run
--    waited up to the refresh spacing (30 s), while a trigger runs within milliseconds.
--    Now each way that lifts a pause -- resume(), define_job(paused => false) and sync
--    (an entry that says paused = false, or lifts a pause sync made) -- also raises that
--    run's dispatch wake, the payload trigger() sends ({"run", "dispatch", "job",
--    "priority", "worker"}), when the job is valid and the run is queued and due (a retry
--    waiting for its backoff is armed by the refresh, as before), unless the session
--    suppresses wakes. The daemon claims it at once, under the same checks (the claim
--    reads the job as committed); the refresh still follows, coalesced.
--
-- New: _target_problem, _dispatch_queued. Redefined, each from its latest definition:
-- define_job, sync (0013; same signatures, so their grants stay) and resume (0001, with
-- 0004's enable_seqscan = off). Every function runs with enable_seqscan = off (0004).

-- What is wrong with a target, or NULL; as Target.from_json (coordinator/model.py) says it.
CREATE FUNCTION coordinator._target_problem(p_target jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET enable_seqscan = off AS $$
DECLARE
    kind jsonb := CASE WHEN jsonb_typeof(p_target) = 'object' THEN p_target->'kind' END;
BEGIN
    IF jsonb_typeof(p_target) IS DISTINCT FROM 'object' THEN
        RETURN 'must be a JSON object';
    ELSIF kind = '"worker"' THEN
        IF jsonb_typeof(p_target->'type') IS DISTINCT FROM 'string'
           OR p_target->>'type' = '' THEN
            RETURN 'worker target needs a non-empty ''type''';
        END IF;
    ELSIF kind = '"exec"' THEN
        IF jsonb_typeof(p_target->'argv') IS DISTINCT FROM 'array'
           OR jsonb_array_length(p_target->'argv') = 0
           OR EXISTS (SELECT 1 FROM jsonb_array_elements(p_target->'argv') a
                       WHERE jsonb_typeof(a) <> 'string') THEN
            RETURN 'exec target needs ''argv'', a non-empty list of strings';
        END IF;
        -- (As Python's `data.get("env") or {}`: a false, empty or zero value is no env.)
        IF p_target->'env' IS NOT NULL
           AND p_target->'env' NOT IN ('null', 'false', '0', '""', '[]', '{}')
           AND (jsonb_typeof(p_target->'env') <> 'object'
                OR EXISTS (SELECT 1 FROM jsonb_each(p_target->'env') e
                            WHERE jsonb_typeof(e.value) <> 'string')) THEN
            RETURN 'exec target ''env'' must map strings to strings';
        END IF;
        IF coalesce(jsonb_typeof(p_target->'cwd'), 'null') NOT IN ('null', 'string') THEN
            RETURN 'exec target ''cwd'' must be a string';
        END IF;
    ELSE
        -- (As Python shows a string, null or number kind: 'shell', None, 5; other JSON
        -- values as JSON, where Python would show its own repr.)
        RETURN 'target kind must be ''exec'' or ''worker'', not '
               || CASE WHEN kind IS NULL OR kind = 'null' THEN 'None'
                       WHEN jsonb_typeof(kind) = 'string' THEN quote_literal(kind #>> '{}')
                       ELSE kind::text END;
    END IF;
    RETURN NULL;
END
$$;


-- The dispatch wake of job p_job's queued, due run (item 2), when the job is valid and not
-- paused and the session does not suppress wakes; nothing otherwise.
CREATE FUNCTION coordinator._dispatch_queued(p_job bigint) RETURNS void
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    run_id   bigint;
    priority text;
    worker   text;
BEGIN
    IF coordinator._wakes_suppressed() THEN
        RETURN;
    END IF;
    SELECT j.priority, CASE WHEN j.target->>'kind' = 'worker' THEN j.target->>'type' END
      INTO priority, worker
      FROM coordinator.jobs j
     WHERE j.id = p_job AND NOT j.paused AND j.invalid_reason IS NULL
       AND j.removed_at IS NULL;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT r.id INTO run_id FROM coordinator.runs r
     WHERE r.job_id = p_job AND r.status = 'queued' AND (r.due_at IS NULL OR r.due_at <= now());
    IF run_id IS NOT NULL THEN
        PERFORM pg_notify('coordinator', json_build_object(
                    'run', run_id, 'dispatch', true, 'job', p_job, 'priority', priority,
                    'worker', worker)::text);
    END IF;
END
$$;

-- As in 0013, plus the target's check (item 1) and the wake of an un-paused job's queued
-- run (item 2).
CREATE OR REPLACE FUNCTION coordinator.define_job(
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
    recoverable     boolean DEFAULT false,
    alert           boolean DEFAULT true,
    keep_last       integer DEFAULT NULL,
    retention       interval DEFAULT NULL
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
    was_paused   boolean;
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
    IF reason IS NULL THEN
        problem := coordinator._target_problem(target);
        IF problem IS NOT NULL THEN
            RAISE EXCEPTION 'target: %', problem
                USING ERRCODE = 'invalid_parameter_value', COLUMN = 'target';
        END IF;
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
    IF keep_last < 1 OR keep_last > 1000000000 THEN
        RAISE EXCEPTION 'keep_last: must be between 1 and 1000000000, not %', keep_last
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'keep_last';
    END IF;
    IF retention <= interval '0' OR retention > interval '3650 days' THEN
        RAISE EXCEPTION 'retention: must be greater than zero and at most 3650d, not %',
                        retention
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'retention';
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

    -- Whether this call lifts a pause (item 2). (Read before the upsert; a concurrent
    -- change only makes the wake a harmless hint too many or too few.)
    IF want_paused IS FALSE THEN
        SELECT j.paused INTO was_paused FROM coordinator.jobs j
         WHERE j.namespace = namespace AND j.name = name AND j.removed_at IS NULL;
    END IF;

    -- Dynamic SQL for one reason: the conflict target names the columns namespace and
    -- name, which are also parameters here (and a partial unique index, unlike the old
    -- constraint, cannot be named with ON CONSTRAINT).
    EXECUTE $sql$
    INSERT INTO coordinator.jobs AS j (namespace, name, schedule_kind, schedule, timezone,
                                       target, params, timeout, priority, idempotent, paused,
                                       invalid_reason, next_run_at, retries, retry_backoff,
                                       retry_max_delay, misfire, misfire_grace, recoverable,
                                       alert, keep_last, retention)
    VALUES ($1, $2, $3, $4, coalesce($5, 'UTC'), $6, coalesce($7, '{}'), $8,
            coalesce($9, 'background'), coalesce($10, false), coalesce($11, false), $12, $13,
            $14, $15, $16, $17, $18, coalesce($19, false), coalesce($20, true), $21, $22)
    ON CONFLICT (namespace, name) WHERE removed_at IS NULL DO UPDATE SET
        schedule_kind    = excluded.schedule_kind,
        schedule         = excluded.schedule,
        timezone         = excluded.timezone,
        target           = excluded.target,
        params           = excluded.params,
        timeout          = excluded.timeout,
        priority         = excluded.priority,
        idempotent       = excluded.idempotent,
        paused           = coalesce($11, j.paused),
        invalid_reason   = excluded.invalid_reason,
        retries          = excluded.retries,
        retry_backoff    = excluded.retry_backoff,
        retry_max_delay  = excluded.retry_max_delay,
        misfire          = excluded.misfire,
        misfire_grace    = excluded.misfire_grace,
        recoverable      = excluded.recoverable,
        alert            = excluded.alert,
        keep_last        = excluded.keep_last,
        retention        = excluded.retention,
        schedule_version = CASE WHEN (j.schedule_kind, j.schedule, j.timezone)
                                     IS DISTINCT FROM
                                     (excluded.schedule_kind, excluded.schedule, excluded.timezone)
                                THEN j.schedule_version + 1 ELSE j.schedule_version END,
        next_run_at      = CASE WHEN (j.schedule_kind, j.schedule, j.timezone)
                                     IS DISTINCT FROM
                                     (excluded.schedule_kind, excluded.schedule, excluded.timezone)
                                THEN excluded.next_run_at ELSE j.next_run_at END,
        updated_at       = now()
    RETURNING j.id
    $sql$ INTO job_id
    USING namespace, name, schedule_kind, schedule, timezone, target, params, timeout,
          priority, idempotent, want_paused, reason, once_at, n_retries, backoff, max_delay,
          policy, misfire_grace, recoverable, alert, keep_last, retention;
    IF was_paused THEN
        PERFORM coordinator._dispatch_queued(job_id);
    END IF;
    RETURN job_id;
END
$$;


-- As in 0001 (0004: enable_seqscan = off), plus item 2.
-- Resuming a recurring job forgets the deadline saved before the pause: ticks that fell
-- inside the pause are not owed. A one-shot job keeps its instant.
CREATE OR REPLACE FUNCTION coordinator.resume(namespace text, name text) RETURNS void
LANGUAGE plpgsql SET enable_seqscan = off AS $$
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
    IF FOUND THEN
        PERFORM coordinator._dispatch_queued(jid);
    END IF;
END
$$;

-- As in 0013, plus item 2.
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
    was_paused      boolean;
    want_paused     boolean;
    job_id          bigint;
    unpaused        bigint[] := '{}';
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
        SELECT j.sync_paused, j.paused INTO was_sync_paused, was_paused FROM coordinator.jobs j
         WHERE j.namespace = namespace AND j.name = entry->>'name' AND j.removed_at IS NULL;
        IF FOUND THEN
            n_updated := n_updated + 1;
        ELSE
            n_created := n_created + 1;
        END IF;
        want_paused := coalesce((entry->>'paused')::boolean,
                                CASE WHEN was_sync_paused THEN false END);
        job_id := coordinator.define_job(
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
            paused          => want_paused,
            invalid_reason  => entry->>'invalid_reason',
            retries         => (entry->>'retries')::integer,
            retry_backoff   => (entry->>'retry_backoff')::interval,
            retry_max_delay => (entry->>'retry_max_delay')::interval,
            misfire         => entry->>'misfire',
            misfire_grace   => (entry->>'misfire_grace')::interval,
            recoverable     => coalesce((entry->>'recoverable')::boolean, false),
            alert           => coalesce((entry->>'alert')::boolean, true),
            keep_last       => (entry->>'keep_last')::integer,
            retention       => (entry->>'retention')::interval);
        IF was_paused AND want_paused IS FALSE THEN
            unpaused := unpaused || job_id;
        END IF;
        names := names || (entry->>'name');
    END LOOP;
    UPDATE coordinator.jobs j SET paused = true, sync_paused = true, updated_at = now()
     WHERE j.namespace = namespace AND j.removed_at IS NULL AND NOT j.paused
       AND NOT (j.name = ANY (names));
    GET DIAGNOSTICS n_paused = ROW_COUNT;
    PERFORM set_config('coordinator.origin', coalesce(previous_origin, ''), true);
    IF NOT coordinator._wakes_suppressed() THEN
        PERFORM pg_notify('coordinator', json_build_object('sync', namespace)::text);
        -- (Item 2: define_job ran quiet here; the runs of the jobs it un-paused now.)
        FOREACH job_id IN ARRAY unpaused LOOP
            PERFORM coordinator._dispatch_queued(job_id);
        END LOOP;
    END IF;
    RETURN QUERY SELECT n_created, n_updated, n_paused;
END
$$;
