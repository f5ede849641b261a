-- Confinement that a setting cannot lift, and define_job's name refused in one line
-- (both found by a helper using the SQL API as confined roles, 2026-12-02).
--
-- 1. The guard triggers on jobs and runs (0014, 0019) were skipped for any session that
--    set coordinator.origin = 'daemon', a setting every role may set. For most writes
--    that only lost the wording (the policies refuse), but not for a row moved out of a
--    namespace the role may only read: the UPDATE policies' USING admits the readable
--    rows (so that the guard can word a refusal) and their WITH CHECK sees only the new
--    row. A role reading `billing` and operating `mine` could
--    `SET coordinator.origin = 'daemon'; UPDATE coordinator.jobs SET namespace = 'mine'
--    WHERE namespace = 'billing'` (or point billing's runs at a job of its own), then
--    delete them. The guard is therefore part of the enforcement, and it is now skipped
--    only for roles that may do everything anyway: those the policies do not confine
--    (row_security_active false: the owner, a superuser, BYPASSRLS, as before) and
--    members of coordinator_daemon (asked only when the setting says 'daemon', so an
--    application's write pays nothing more). The daemon's claims and settlements fire
--    no more triggers than before, as the owner or as a coordinator_daemon member.
--
-- 2. define_job() checks the name before the INSERT, as it checks the namespace since
--    0028: 22023 with COLUMN name, one line (it was 23514 from the check trigger, with
--    a CONTEXT quoting the whole dynamic INSERT ... ON CONFLICT). The same refusals; an
--    empty name or namespace is now said as such (it read 'at most 200 characters, not
--    0'), in the client's words.
--
-- Redefined: _name_problem and _namespace_problem (0005; the same answers but for the
-- words of an empty one), define_job (from its latest definition, 0028, with only the
-- name's check added); the triggers jobs_guard and runs_guard (0019) with the new WHEN.

CREATE OR REPLACE FUNCTION coordinator._namespace_problem(p_namespace text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN p_namespace = '' THEN 'namespace: must be a non-empty string'
        WHEN char_length(p_namespace) NOT BETWEEN 1 AND 63 THEN
            'namespace: at most 63 characters, not ' || char_length(p_namespace)::text
        WHEN p_namespace !~ '^[A-Za-z0-9][A-Za-z0-9._-]*$' THEN
            'namespace: use letters, digits, ''.'', ''_'' and ''-'', starting with a letter or a digit'
    END
$$;

CREATE OR REPLACE FUNCTION coordinator._name_problem(p_name text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN p_name = '' THEN 'name: must be a non-empty string'
        WHEN char_length(p_name) NOT BETWEEN 1 AND 200 THEN
            'name: at most 200 characters, not ' || char_length(p_name)::text
        WHEN p_name ~ '[\u0001-\u001f\u007f-\u009f\u2028\u2029]' THEN
            coordinator._control_problem(
                p_name, substring(p_name from '[\u0001-\u001f\u007f-\u009f\u2028\u2029]'))
        WHEN p_name ~ '^[\u0020\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]|[\u0020\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]$' THEN
            'name: must not start or end with whitespace'
    END
$$;

DROP TRIGGER jobs_guard ON coordinator.jobs;
CREATE TRIGGER jobs_guard BEFORE INSERT OR UPDATE ON coordinator.jobs
    FOR EACH ROW
    WHEN (pg_catalog.row_security_active('coordinator.jobs'::regclass)
          AND (current_setting('coordinator.origin', true) IS DISTINCT FROM 'daemon'
               OR NOT pg_catalog.pg_has_role('coordinator_daemon', 'USAGE')))
    EXECUTE FUNCTION coordinator._jobs_guard();
DROP TRIGGER runs_guard ON coordinator.runs;
CREATE TRIGGER runs_guard BEFORE INSERT OR UPDATE ON coordinator.runs
    FOR EACH ROW
    WHEN (pg_catalog.row_security_active('coordinator.jobs'::regclass)
          AND (current_setting('coordinator.origin', true) IS DISTINCT FROM 'daemon'
               OR NOT pg_catalog.pg_has_role('coordinator_daemon', 'USAGE')))
    EXECUTE FUNCTION coordinator._runs_guard();

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
    problem text := coordinator._namespace_problem(namespace);
BEGIN
    -- The namespace first, as sync() and trigger() check it: refused here, the refusal
    -- is one line; refused by the row security of _define_job's INSERT, its CONTEXT
    -- quoted the whole dynamic INSERT ... ON CONFLICT statement (about 40 lines).
    IF namespace IS NOT NULL THEN
        IF problem IS NOT NULL THEN
            RAISE EXCEPTION '%', problem
                USING ERRCODE = 'invalid_parameter_value', COLUMN = 'namespace';
        END IF;
        IF NOT coordinator._may(namespace, true) THEN
            PERFORM coordinator._require_namespace(namespace, true);
        END IF;
    END IF;
    -- The name next, in the same words: refused by the jobs table's check trigger, the
    -- refusal was 23514 with a CONTEXT quoting the whole INSERT ... ON CONFLICT.
    IF name IS NOT NULL AND coordinator._name_problem(name) IS NOT NULL THEN
        RAISE EXCEPTION '%', coordinator._name_problem(name)
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'name';
    END IF;
    IF schedule_kind NOT IN ('cron', 'interval', 'once', 'manual') THEN
        RAISE EXCEPTION 'schedule_kind: must be cron, interval, once or manual, not %',
                        quote_literal(schedule_kind)
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'schedule_kind';
    END IF;
    IF schedule_kind = 'manual' AND schedule IS NOT NULL THEN
        RAISE EXCEPTION 'schedule: a manual job has none (it runs when triggered), not %',
                        quote_literal(schedule)
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'schedule';
    ELSIF schedule_kind <> 'manual' AND schedule IS NULL THEN
        RAISE EXCEPTION 'schedule: required for a % job', schedule_kind
            USING ERRCODE = 'null_value_not_allowed', COLUMN = 'schedule';
    END IF;
    IF priority NOT IN ('interactive', 'background') THEN
        RAISE EXCEPTION 'priority: must be interactive or background, not %',
                        quote_literal(priority)
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'priority';
    END IF;
    IF jsonb_typeof(params) <> 'object' THEN
        RAISE EXCEPTION 'params: must be a JSON object, not %', jsonb_typeof(params)
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'params';
    END IF;
    -- Zero, negative or finer than a microsecond: out of bounds, not a non-duration.
    IF schedule_kind = 'interval' AND invalid_reason IS NULL
       AND coordinator._duration_us(schedule) IS NULL
       AND coordinator._duration_sign_problem(schedule) IS NOT NULL THEN
        RAISE EXCEPTION '%', coordinator._interval_problem(schedule)
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'every';
    END IF;
    RETURN coordinator._define_job(name, schedule_kind, target, schedule, namespace, timezone,
                                   params, timeout, priority, idempotent, paused,
                                   invalid_reason, retries, retry_backoff, retry_max_delay,
                                   misfire, misfire_grace, recoverable, alert, keep_last,
                                   retention);
END
$$;
