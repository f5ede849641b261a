-- Front doors, version 5: what a name and a duration may be, said by the database too.
--
-- The Python front doors (coordinator/text.py, coordinator/schedule.py) hold the same
-- rules and refuse first, in one line naming the field; these are the last word for every
-- other writer (plain SQL, other languages, the SQL API):
--
--   namespace   1 to 63 characters, ^[A-Za-z0-9][A-Za-z0-9._-]*$
--   job name    1 to 200 characters, no control character (C0, DEL, C1, U+2028, U+2029),
--               no whitespace at either end; anything else, '/' included
--   interval    the grammar of coordinator.schedule.parse_duration, 1s to 3650d
--   timeout     greater than zero, at most 3650 days
--   deadline    (next_run_at) in the years 1970 to 9999 (UTC): beyond them Python's
--               datetime, and so the daemon, cannot follow
--
-- Names and interval text are checked by a BEFORE trigger, when they are written, rather
-- than by CHECK constraints, for two reasons:
--   * PostgreSQL evaluates every CHECK on every UPDATE of a row, whichever columns change.
--     A row stored before this migration under a name the rules now refuse (a namespace
--     with a space, say) would make each later update of that row fail, the daemon's
--     batch deadline writes included (one bad row fails the whole batch). The trigger
--     checks a value only on INSERT and when an UPDATE changes it: old rows keep working,
--     and can still be renamed or removed.
--   * Parsing an interval costs microseconds; the daemon's writes (a deadline per run,
--     a batch of all new jobs at start) never change a name or a schedule and so never
--     pay for it (WHEN clause, UPDATE OF column list).
-- An unparsable interval is still storable with invalid_reason set (the job is inert), as
-- before: that is how sync stores a manifest entry with problems.
--
-- Timeouts and deadlines are CHECK constraints (a comparison costs nothing). Rows that
-- would break them, and interval rows the trigger would refuse, are first made inert here
-- with the reason, which is what the daemon does with an unusable job: such rows crash
-- today's daemon (OverflowError), so nothing that worked stops working.
--
-- Item 8: the SQL API functions refuse NULL where it would otherwise be read silently
-- (sync(NULL, ...) returned 0/0/0; resolve(id, NULL) closed the run as failed).
-- Redefined here: define_job, sync, _job_id (0001: NULL and bound checks added) and
-- resolve, cancel (0003: NULL checks added; bodies otherwise unchanged).

-- Every PL/pgSQL function here runs with enable_seqscan = off, as 0004 explains (plans
-- that survive statistics); CREATE OR REPLACE resets a function's settings, so the
-- functions this file replaces repeat it.

-- ---------------------------------------------------------------------------------------
-- Rules, as immutable functions (tests compare them with the Python ones character by
-- character). Whitespace is Python's str.isspace set, spelled out: PostgreSQL's \s
-- depends on the locale.
-- ---------------------------------------------------------------------------------------

-- The microseconds a duration stands for, in the grammar of parse_duration: `90`, `90s`,
-- `500ms`, `5m`, `1h30m`, `1h 30m`, `1.5h`, `2d`, `1w` (units case-insensitive, largest
-- first, each once; a bare number is seconds and stands alone; a number has at most 30
-- characters). NULL when the text is not a duration, is zero, or is finer than a
-- microsecond. No upper bound: callers compare.
CREATE FUNCTION coordinator._duration_us(p_text text) RETURNS numeric
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET enable_seqscan = off AS $$
DECLARE
    ws      constant text := '[\u0009-\u000d\u001c-\u0020\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]';
    num     constant text := '(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)';
    compact text := regexp_replace(p_text, ws || '+', '', 'g');
    total   numeric := 0;
    token   text;
BEGIN
    -- Whitespace may surround a component and separate a number from its unit; once the
    -- two places it may not be (inside a number, inside or between units) are refused,
    -- it can be dropped.
    IF compact IS NULL OR compact = ''
       OR (compact <> p_text AND p_text ~ ('[0-9.]' || ws || '+[0-9.]|[A-Za-z]' || ws || '+[A-Za-z]'))
       OR (length(compact) > 30 AND compact ~ '[0-9.]{31}') THEN
        RETURN NULL;
    END IF;
    IF compact ~ ('^' || num || '$') THEN
        total := compact::numeric * 1000000;
    ELSIF compact ~ ('^(?:' || num || '[wW])?(?:' || num || '[dD])?(?:' || num || '[hH])?(?:'
                     || num || '[mM])?(?:' || num || '[sS])?(?:' || num || '[mM][sS])?$') THEN
        FOREACH token IN ARRAY regexp_split_to_array(translate(compact, 'WDHMS', 'wdhms'),
                                                     '(?<=[a-z])(?=[0-9.])') LOOP
            total := total + rtrim(token, 'wdhms')::numeric
                             * CASE ltrim(token, '0123456789.')
                                   WHEN 'w' THEN 604800000000 WHEN 'd' THEN 86400000000
                                   WHEN 'h' THEN 3600000000 WHEN 'm' THEN 60000000
                                   WHEN 's' THEN 1000000 ELSE 1000 END;
        END LOOP;
    ELSE
        RETURN NULL;
    END IF;
    RETURN CASE WHEN total > 0 AND total = trunc(total) THEN total END;
END
$$;

-- Why an interval schedule is unusable ('every: ...'), or NULL: not a duration, under 1s,
-- or over 3650d.
CREATE FUNCTION coordinator._interval_problem(p_schedule text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET enable_seqscan = off AS $$
DECLARE
    us numeric := coordinator._duration_us(p_schedule);
BEGIN
    IF us IS NULL THEN
        RETURN 'every: ' || quote_nullable(p_schedule)
               || ' is not a duration (expected e.g. 90s, 5m, 1h30m)';
    ELSIF us < 1000000 THEN
        RETURN 'every: ' || quote_literal(p_schedule) || ': an interval must be at least 1s';
    ELSIF us > 315360000000000 THEN
        -- (The text as parse_duration shows it: whitespace runs as one space.)
        RETURN 'every: at most 3650d, not '
               || btrim(regexp_replace(p_schedule, '[\u0009-\u000d\u001c-\u0020\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+', ' ', 'g'));
    END IF;
    RETURN NULL;
END
$$;

-- Why a namespace is refused ('namespace: ...'), or NULL (also for NULL: NOT NULL says it).
CREATE FUNCTION coordinator._namespace_problem(p_namespace text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN char_length(p_namespace) NOT BETWEEN 1 AND 63 THEN
            'namespace: at most 63 characters, not ' || char_length(p_namespace)::text
        WHEN p_namespace !~ '^[A-Za-z0-9][A-Za-z0-9._-]*$' THEN
            'namespace: use letters, digits, ''.'', ''_'' and ''-'', starting with a letter or a digit'
    END
$$;

-- The message for the first control character of a name (the rare path, kept apart so
-- that _name_problem's common path stays one inlined expression).
CREATE FUNCTION coordinator._control_problem(p_name text, p_char text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT 'name: control characters are not allowed (U+'
           || lpad(upper(to_hex(ascii(p_char))), 4, '0') || ' at character '
           || strpos(p_name, p_char)::text || ')'
$$;

-- Why a job name is refused ('name: ...'), or NULL (also for NULL: NOT NULL says it).
CREATE FUNCTION coordinator._name_problem(p_name text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN char_length(p_name) NOT BETWEEN 1 AND 200 THEN
            'name: at most 200 characters, not ' || char_length(p_name)::text
        WHEN p_name ~ '[\u0001-\u001f\u007f-\u009f\u2028\u2029]' THEN
            coordinator._control_problem(
                p_name, substring(p_name from '[\u0001-\u001f\u007f-\u009f\u2028\u2029]'))
        WHEN p_name ~ '^[\u0020\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]|[\u0020\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]$' THEN
            'name: must not start or end with whitespace'
    END
$$;

-- ---------------------------------------------------------------------------------------
-- Rows that would break the new checks: made inert with the reason (see the top).
-- ---------------------------------------------------------------------------------------

UPDATE coordinator.jobs
   SET invalid_reason = format('timeout: at most 3650d, not %s', timeout), updated_at = now()
 WHERE timeout > interval '3650 days' AND invalid_reason IS NULL;

UPDATE coordinator.jobs
   SET invalid_reason = CASE WHEN schedule_kind = 'once' THEN coalesce(invalid_reason,
                                 format('at: %s is out of range (the years 1970 to 9999, in UTC)',
                                        quote_literal(schedule)))
                             ELSE invalid_reason END,
       next_run_at = NULL, updated_at = now()
 WHERE NOT (next_run_at >= '1970-01-01 00:00:00+00' AND next_run_at < '10000-01-01 00:00:00+00');

UPDATE coordinator.jobs
   SET invalid_reason = coordinator._interval_problem(schedule), next_run_at = NULL,
       updated_at = now()
 WHERE schedule_kind = 'interval' AND invalid_reason IS NULL
   AND coordinator._interval_problem(schedule) IS NOT NULL;

-- ---------------------------------------------------------------------------------------
-- Constraints and the write-time trigger.
-- ---------------------------------------------------------------------------------------

-- jobs_timeout_check keeps its name (the client reads the field from it) and gains the
-- bound; an inert job may keep what it was given, as an inert manifest entry does.
ALTER TABLE coordinator.jobs
    DROP CONSTRAINT jobs_timeout_check,
    ADD CONSTRAINT jobs_timeout_check
        CHECK (timeout > interval '0'
               AND (timeout <= interval '3650 days' OR invalid_reason IS NOT NULL)) NOT VALID,
    ADD CONSTRAINT jobs_next_run_at_check
        CHECK (next_run_at >= '1970-01-01 00:00:00+00'
               AND next_run_at < '10000-01-01 00:00:00+00') NOT VALID;
-- (Every row passes now: the updates above saw to it.)
ALTER TABLE coordinator.jobs VALIDATE CONSTRAINT jobs_timeout_check;
ALTER TABLE coordinator.jobs VALIDATE CONSTRAINT jobs_next_run_at_check;

-- Raised as check_violation naming a constraint jobs_<field>_check and the column, like a
-- CHECK would, so clients tell the field the same way.
CREATE FUNCTION coordinator._jobs_check() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    inserting boolean := TG_OP = 'INSERT';
    problem   text;
    field     text;
BEGIN
    IF inserting OR NEW.namespace IS DISTINCT FROM OLD.namespace THEN
        problem := coordinator._namespace_problem(NEW.namespace);
        field := 'namespace';
    END IF;
    IF problem IS NULL AND (inserting OR NEW.name IS DISTINCT FROM OLD.name) THEN
        problem := coordinator._name_problem(NEW.name);
        field := 'name';
    END IF;
    IF problem IS NULL AND NEW.schedule_kind = 'interval' AND NEW.invalid_reason IS NULL
       AND (inserting OR (NEW.schedule_kind, NEW.schedule, NEW.invalid_reason)
                         IS DISTINCT FROM (OLD.schedule_kind, OLD.schedule, OLD.invalid_reason)) THEN
        problem := coordinator._interval_problem(NEW.schedule);
        field := 'every';
    END IF;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION '%', problem
            USING ERRCODE = 'check_violation', CONSTRAINT = format('jobs_%s_check', field),
                  COLUMN = field, SCHEMA = 'coordinator', TABLE = 'jobs';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER jobs_check_insert BEFORE INSERT ON coordinator.jobs
    FOR EACH ROW EXECUTE FUNCTION coordinator._jobs_check();
CREATE TRIGGER jobs_check_update
    BEFORE UPDATE OF namespace, name, schedule_kind, schedule, invalid_reason
    ON coordinator.jobs FOR EACH ROW
    WHEN ((OLD.namespace, OLD.name, OLD.schedule_kind, OLD.schedule, OLD.invalid_reason)
          IS DISTINCT FROM
          (NEW.namespace, NEW.name, NEW.schedule_kind, NEW.schedule, NEW.invalid_reason))
    EXECUTE FUNCTION coordinator._jobs_check();

-- ---------------------------------------------------------------------------------------
-- The SQL API refuses NULL where it would read it silently.
-- ---------------------------------------------------------------------------------------

CREATE FUNCTION coordinator._require(p_value anyelement, p_argument text) RETURNS void
LANGUAGE plpgsql SET enable_seqscan = off AS $$
BEGIN
    IF p_value IS NULL THEN
        RAISE EXCEPTION '%: must not be NULL', p_argument
            USING ERRCODE = 'null_value_not_allowed', COLUMN = p_argument;
    END IF;
END
$$;

-- As in 0001, plus: NULL namespace/name (trigger, pause, resume, remove) refused by name.
CREATE OR REPLACE FUNCTION coordinator._job_id(p_namespace text, p_name text, p_lock boolean)
RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    found_id bigint;
BEGIN
    IF p_namespace IS NULL OR p_name IS NULL THEN
        PERFORM coordinator._require(p_namespace, 'namespace');
        PERFORM coordinator._require(p_name, 'name');
    END IF;
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

-- As in 0001, plus: name, schedule_kind, target and namespace may not be NULL (a NULL
-- namespace used to mean 'default'); names are checked by the trigger. Without an
-- invalid_reason: an interval that is not a duration is stored inert as before, but one
-- outside 1s..3650d is refused, and so are a one-shot instant outside the years 1970 to
-- 9999 and a timeout over 3650 days (each raised as invalid_parameter_value naming the
-- field in COLUMN and in the message).
CREATE OR REPLACE FUNCTION coordinator.define_job(
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
LANGUAGE plpgsql SET enable_seqscan = off AS $$
#variable_conflict use_variable
DECLARE
    job_id       bigint;
    once_at      timestamptz;
    reason       text := invalid_reason;
    problem      text;
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
                                       invalid_reason, next_run_at)
    VALUES (namespace, name, schedule_kind, schedule,
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

-- As in 0001, plus: a NULL or refused namespace, and an entry that is not an object or has
-- no name, are refused (sync(NULL, '[]') used to answer 0/0/0 and change nothing).
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

-- As in 0003, plus: NULL run_id or outcome refused (resolve(id, NULL) used to close the
-- run as failed). If 0004 redefines resolve or cancel, these two IF blocks belong there.
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
END
$$;
