-- Targets checked at the front door (found by a new user's first hour): define_job stored
-- any JSON object as a job's target, so `{"kind": "shell", ...}` or an exec target
-- without argv was listed active and failed only when it ran ("bad target: ..."), while
-- the CLI, the Python client, a manifest and a worker's declaration all refuse it. Now
-- define_job (and sync, which calls it) refuses it too, in the words of
-- coordinator.model.Target.from_json, naming the argument (SQLSTATE 22023, COLUMN
-- 'target'). An entry stored inert on purpose (invalid_reason given: a manifest's entry
-- with problems) keeps any object, as before. Plain INSERT/UPDATE is not checked here: a
-- CHECK constraint would run on every update of the row (0005 explains why the jobs
-- table has none that costs); the executors still refuse such a target when it runs.
--
-- New: _target_problem. Redefined, from its latest definition: define_job (0013; same
-- signature, so its grants stay). Every function runs with enable_seqscan = off (0004).

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
        IF coalesce(jsonb_typeof(p_target->'env'), 'null') NOT IN ('null', 'object')
           OR EXISTS (SELECT 1
                        FROM jsonb_each(CASE WHEN jsonb_typeof(p_target->'env') = 'object'
                                             THEN p_target->'env' END) e
                       WHERE jsonb_typeof(e.value) <> 'string') THEN
            RETURN 'exec target ''env'' must map strings to strings';
        END IF;
        IF coalesce(jsonb_typeof(p_target->'cwd'), 'null') NOT IN ('null', 'string') THEN
            RETURN 'exec target ''cwd'' must be a string';
        END IF;
    ELSE
        -- (As Python shows the kind: 'shell', None, 5.)
        RETURN 'target kind must be ''exec'' or ''worker'', not '
               || CASE WHEN kind IS NULL OR kind = 'null' THEN 'None'
                       WHEN jsonb_typeof(kind) = 'string' THEN quote_literal(kind #>> '{}')
                       ELSE kind::text END;
    END IF;
    RETURN NULL;
END
$$;

-- As in 0013, plus the target's check.
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
    RETURN job_id;
END
$$;
