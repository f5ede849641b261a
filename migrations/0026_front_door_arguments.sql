-- The SQL API's two definers, define_job() and sync(), refuse what they stored or let
-- through without a word, each refusal naming its argument (SQLSTATE 22023, or 22004
-- for a missing one, with the argument in COLUMN) as their other arguments' do:
--
-- define_job():
--   * schedule_kind, priority and params that the table's CHECK constraints refused
--     (23514, "violates check constraint jobs_priority_check", the failing row and the
--     whole INSERT statement in the error): named now;
--   * a schedule for a manual job, or none for a cron, interval or one-shot job (the same
--     constraint, jobs_check): named now;
--   * an interval of zero or less ('0', '0s', '-5', '-5m'), which was stored inert as
--     "not a duration" although README says an interval below 1s is refused: refused,
--     like '0.5'. (An expression that is not a duration at all is stored inert with its
--     reason, as before, as an unparsable cron expression is.)
--
-- sync():
--   * an entry's key it does not know ("retires": 3) was ignored, where a manifest and a
--     worker's declaration refuse it: refused, naming the entry and the key;
--   * a name listed twice: the last entry won, counted twice; refused, as the manifest does;
--   * a boolean, whole number or text key of another JSON type ("retries": "three") failed
--     with the cast's words and no entry named: refused, naming the entry and the key;
--   * a role with no grant of the namespace could sync an empty list (answered 0, 0, 0:
--     row-level security hid the jobs it would have paused): refused like a define.
--
-- How: each is renamed (_define_job, _sync: their grants, rules and bodies unchanged, and
-- sync's calls of define_job now come through the new define_job's checks) and a
-- function of the same name and signature checks the arguments first, then calls it. The
-- daemon sends neither (a worker's declaration is synced by _declare, whose entries are
-- built by the daemon with known keys and types), so no hot path changes.

ALTER FUNCTION coordinator.define_job(text, text, jsonb, text, text, text, jsonb, interval,
                                      text, boolean, boolean, text, integer, interval,
                                      interval, text, interval, boolean, boolean, integer,
                                      interval)
    RENAME TO _define_job;

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
    recoverable     boolean DEFAULT false,
    alert           boolean DEFAULT true,
    keep_last       integer DEFAULT NULL,
    retention       interval DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off AS $$
#variable_conflict use_variable
BEGIN
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
    -- A zero or negative number of any unit: below the least interval, not a non-duration.
    IF schedule_kind = 'interval' AND invalid_reason IS NULL
       AND (schedule ~ '^\s*-\s*[0-9.]'
            OR schedule ~ '^\s*(0+\.?0*|\.0+)\s*(ms|[smhdw])?\s*$') THEN
        RAISE EXCEPTION 'every: %: an interval must be at least 1s', quote_literal(schedule)
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'every';
    END IF;
    RETURN coordinator._define_job(name, schedule_kind, target, schedule, namespace, timezone,
                                   params, timeout, priority, idempotent, paused,
                                   invalid_reason, retries, retry_backoff, retry_max_delay,
                                   misfire, misfire_grace, recoverable, alert, keep_last,
                                   retention);
END
$$;

ALTER FUNCTION coordinator.sync(text, jsonb) RENAME TO _sync;

CREATE FUNCTION coordinator.sync(namespace text, jobs jsonb)
RETURNS TABLE (created integer, updated integer, paused integer)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
#variable_conflict use_variable
DECLARE
    problem text;
BEGIN
    PERFORM coordinator._require(namespace, 'namespace');
    IF NOT coordinator._may(namespace, true) THEN
        PERFORM coordinator._require_namespace(namespace, true);
    END IF;
    IF jobs IS NOT NULL AND jsonb_typeof(jobs) = 'array' THEN
        -- The first entry's first key (in key order) that is unknown or of another type;
        -- one statement for the whole list. (NULL is a key's default; target and params
        -- are define_job's to check; an entry that is not an object is _sync's.)
        SELECT CASE
                 WHEN k.key NOT IN ('name', 'schedule_kind', 'schedule', 'timezone', 'target',
                                    'params', 'timeout', 'priority', 'idempotent', 'paused',
                                    'invalid_reason', 'retries', 'retry_backoff',
                                    'retry_max_delay', 'misfire', 'misfire_grace',
                                    'recoverable', 'alert', 'keep_last', 'retention')
                   THEN format('jobs[%s]: unknown key %L', a.at - 1, k.key)
                 WHEN k.key IN ('idempotent', 'paused', 'recoverable', 'alert')
                   THEN format('jobs[%s].%s: must be true or false, not %s',
                               a.at - 1, k.key, k.value)
                 WHEN k.key IN ('retries', 'keep_last')
                   THEN format('jobs[%s].%s: must be a whole number, not %s',
                               a.at - 1, k.key, k.value)
                 ELSE format('jobs[%s].%s: must be a string, not %s', a.at - 1, k.key, k.value)
               END
          INTO problem
          FROM jsonb_array_elements(jobs) WITH ORDINALITY AS a(entry, at),
               LATERAL jsonb_each(a.entry) AS k(key, value)
         WHERE jsonb_typeof(a.entry) = 'object'
           AND jsonb_typeof(k.value) <> 'null'
           AND k.key NOT IN ('target', 'params')
           AND CASE
                 WHEN k.key IN ('idempotent', 'paused', 'recoverable', 'alert')
                   THEN jsonb_typeof(k.value) <> 'boolean'
                 WHEN k.key IN ('retries', 'keep_last')
                   THEN jsonb_typeof(k.value) <> 'number'
                        OR (k.value #>> '{}') !~ '^-?[0-9]+$'  -- (2.0 and 1e3 too: as written)
                 WHEN k.key IN ('name', 'schedule_kind', 'schedule', 'timezone', 'timeout',
                                'priority', 'invalid_reason', 'retry_backoff',
                                'retry_max_delay', 'misfire', 'misfire_grace', 'retention')
                   THEN jsonb_typeof(k.value) <> 'string'
                 ELSE true
               END
         ORDER BY a.at, k.key
         LIMIT 1;
        IF problem IS NULL THEN
            SELECT format('jobs[%s].name: %L is listed twice (also jobs[%s])',
                          (array_agg(a.at ORDER BY a.at))[2] - 1, a.entry->>'name',
                          min(a.at) - 1)
              INTO problem
              FROM jsonb_array_elements(jobs) WITH ORDINALITY AS a(entry, at)
             WHERE jsonb_typeof(a.entry) = 'object' AND a.entry->>'name' IS NOT NULL
             GROUP BY a.entry->>'name'
            HAVING count(*) > 1
             ORDER BY (array_agg(a.at ORDER BY a.at))[2]
             LIMIT 1;
        END IF;
        IF problem IS NOT NULL THEN
            RAISE EXCEPTION '%', problem
                USING ERRCODE = 'invalid_parameter_value', COLUMN = 'jobs';
        END IF;
    END IF;
    RETURN QUERY SELECT s.created, s.updated, s.paused FROM coordinator._sync(namespace, jobs) s;
END
$$;
