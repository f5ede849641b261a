-- define_job() refuses a namespace its caller may not operate before anything else, in
-- one line (found by a helper using the SQL API as a confined role, 2026-12-02).
--
-- The refusal came from the row security of _define_job's INSERT, so PostgreSQL's CONTEXT
-- quoted that whole dynamic INSERT ... ON CONFLICT statement. The wrapper of 0026 now
-- checks the namespace first, as sync() (0026) and trigger() (0019) do: a malformed
-- namespace in the rule's words, then _may / _require_namespace's "permission denied for
-- namespace" (42501, with its DETAIL). The same refusals; one SQLSTATE changes: a
-- malformed namespace was refused by the jobs table's check trigger (23514, constraint
-- jobs_namespace_check) and is now 22023 with the argument in COLUMN, as every other
-- argument's refusal (0026). For a role that may operate the namespace nothing changes
-- but one call of _may, and the order: a namespace refusal comes before any other.
--
-- Redefined from its latest definition (0026), with only the check added.

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
