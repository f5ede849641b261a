-- The SQL API's two definers, define_job() and sync(), refuse by name what they stored
-- or refused in other words, each refusal naming its argument (SQLSTATE 22023, or 22004
-- for a missing one, with the argument in COLUMN) as their other arguments' do. What
-- they accepted before, they accept now.
--
-- define_job():
--   * schedule_kind, priority and params that the table's CHECK constraints refused
--     (23514, "violates check constraint jobs_priority_check", the failing row and the
--     whole INSERT statement in the error): named now;
--   * a schedule for a manual job, or none for a cron, interval or one-shot job (the same
--     constraint, jobs_check): named now;
--   * an interval of zero ('0', '0S', '0h0m'), a negative one ('-5m') or one finer than a
--     microsecond, which was stored inert as "not a duration" although README says an
--     interval below 1s is refused: refused in the CLI's words ("a duration must be
--     greater than zero", "must be positive", "finer than a microsecond"). Text that is
--     not a duration at all is stored inert with its reason, as before, as an unparsable
--     cron expression is. _interval_problem, which a plain INSERT's check asks, says the
--     same; _duration_total is _duration_us's grammar with any total.
--
-- sync():
--   * a value that does not cast ("retries": "three", "alert": "yes please", "keep_last":
--     1e10) failed with the cast's words and no entry named: named now ("jobs[0].retries:
--     invalid input syntax for type integer: ..."), found once the cast has failed;
--   * a name listed twice: the last entry won, counted twice; refused, as a manifest and
--     the Python client refuse it;
--   * a key it does not know ("retires": 3) is still ignored, but said in a WARNING
--     (plain SQL writers of sync keep what they had: a manifest's keys are the manifest's);
--   * a role with no grant of the namespace could sync an empty list (answered 0, 0, 0:
--     row-level security hid the jobs it would have paused): refused like a define (after
--     the namespace's own rules, as before).
--
-- How: each is renamed (_define_job, _sync: their grants, rules and bodies unchanged, and
-- sync's calls of define_job now come through the new define_job's checks) and a
-- function of the same name and signature checks the arguments first, then calls it.
-- Calling the renamed ones directly skips only these words: row-level security, the
-- guards and the constraints hold there as everywhere. (They cannot be revoked from
-- PUBLIC: the front doors run as their caller.) The daemon comes through sync only with a
-- worker's changed declaration (_declare calls it by name, so it reaches the new one:
-- entries the daemon builds with known keys and types, which pass every check, at the
-- cost of the checks and one subtransaction); no hot path changes.
--
-- The functions that read durations run with standard_conforming_strings = on (as their
-- patterns assume: with it off, a session read '\.' as '.', and 0005's _duration_us
-- failed on '5m').

-- ---------------------------------------------------------------------------------------
-- Durations: the total of what _duration_us (0005) parses, whatever it is (zero, a
-- fraction of a microsecond); _duration_us answers from it, as before.
-- ---------------------------------------------------------------------------------------

CREATE FUNCTION coordinator._duration_total(p_text text) RETURNS numeric
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET enable_seqscan = off
SET standard_conforming_strings = on AS $$
DECLARE
    ws      constant text := '[\u0009-\u000d\u001c-\u0020\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]';
    num     constant text := '(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)';
    compact text := regexp_replace(p_text, ws || '+', '', 'g');
    total   numeric := 0;
    token   text;
BEGIN
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
    RETURN total;
END
$$;

CREATE OR REPLACE FUNCTION coordinator._duration_us(p_text text) RETURNS numeric
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET enable_seqscan = off
SET standard_conforming_strings = on AS $$
DECLARE
    total numeric := coordinator._duration_total(p_text);
BEGIN
    RETURN CASE WHEN total > 0 AND total = trunc(total) THEN total END;
END
$$;

-- Why a duration is no duration although it reads as one: zero, negative (a '-' before
-- what parses), finer than a microsecond; NULL otherwise. The words of the CLI's
-- schedule.parse_duration.
CREATE FUNCTION coordinator._duration_sign_problem(p_text text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET enable_seqscan = off
SET standard_conforming_strings = on AS $$
DECLARE
    ws    constant text := '[\u0009-\u000d\u001c-\u0020\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]';
    total numeric;
BEGIN
    IF p_text ~ ('^' || ws || '*-') THEN
        total := coordinator._duration_total(regexp_replace(p_text, '^(' || ws || '*)-', '\1'));
        RETURN CASE WHEN total IS NOT NULL THEN 'a duration must be positive' END;
    END IF;
    total := coordinator._duration_total(p_text);
    RETURN CASE WHEN total = 0 THEN 'a duration must be greater than zero'
                WHEN total <> trunc(total) THEN 'finer than a microsecond' END;
END
$$;

CREATE OR REPLACE FUNCTION coordinator._interval_problem(p_schedule text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET enable_seqscan = off
SET standard_conforming_strings = on AS $$
DECLARE
    us   numeric := coordinator._duration_us(p_schedule);
    sign text;
BEGIN
    IF us IS NULL THEN
        sign := coordinator._duration_sign_problem(p_schedule);
        IF sign IS NOT NULL THEN
            RETURN 'every: ' || quote_literal(p_schedule) || ': ' || sign;
        END IF;
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

-- ---------------------------------------------------------------------------------------
-- define_job()
-- ---------------------------------------------------------------------------------------

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

ALTER FUNCTION coordinator.sync(text, jsonb) RENAME TO _sync;

-- ---------------------------------------------------------------------------------------
-- sync()
-- ---------------------------------------------------------------------------------------

CREATE FUNCTION coordinator.sync(namespace text, jobs jsonb)
RETURNS TABLE (created integer, updated integer, paused integer)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
#variable_conflict use_variable
DECLARE
    problem   text := coordinator._namespace_problem(namespace);
    unknown   record;
    item      record;
    cast_to   text;
BEGIN
    PERFORM coordinator._require(namespace, 'namespace');
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION '%', problem
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'namespace';
    END IF;
    IF NOT coordinator._may(namespace, true) THEN
        PERFORM coordinator._require_namespace(namespace, true);
    END IF;
    IF jobs IS NOT NULL AND jsonb_typeof(jobs) = 'array' THEN
        SELECT format('jobs[%s].name: %L is listed twice (also jobs[%s])',
                      (array_agg(a.at ORDER BY a.at))[2] - 1, a.entry->>'name', min(a.at) - 1)
          INTO problem
          FROM jsonb_array_elements(jobs) WITH ORDINALITY AS a(entry, at)
         WHERE jsonb_typeof(a.entry) = 'object' AND a.entry->>'name' IS NOT NULL
         GROUP BY a.entry->>'name'
        HAVING count(*) > 1
         ORDER BY (array_agg(a.at ORDER BY a.at))[2]
         LIMIT 1;
        IF problem IS NOT NULL THEN
            RAISE EXCEPTION '%', problem
                USING ERRCODE = 'invalid_parameter_value', COLUMN = 'jobs';
        END IF;
        FOR unknown IN
            SELECT a.at - 1 AS at, k.key
              FROM jsonb_array_elements(jobs) WITH ORDINALITY AS a(entry, at),
                   LATERAL jsonb_object_keys(a.entry) AS k(key)
             WHERE jsonb_typeof(a.entry) = 'object'
               AND k.key NOT IN ('name', 'schedule_kind', 'schedule', 'timezone', 'target',
                                 'params', 'timeout', 'priority', 'idempotent', 'paused',
                                 'invalid_reason', 'retries', 'retry_backoff',
                                 'retry_max_delay', 'misfire', 'misfire_grace', 'recoverable',
                                 'alert', 'keep_last', 'retention')
             ORDER BY a.at, k.key
             LIMIT 10
        LOOP
            RAISE WARNING 'jobs[%]: unknown key % ignored', unknown.at, quote_literal(unknown.key);
        END LOOP;
    END IF;
    BEGIN
        RETURN QUERY SELECT s.created, s.updated, s.paused
                       FROM coordinator._sync(namespace, jobs) s;
    EXCEPTION WHEN invalid_text_representation OR numeric_value_out_of_range
                   OR invalid_datetime_format OR datetime_field_overflow
                   OR interval_field_overflow THEN
        -- A value that does not cast (the only errors an entry's values raise unnamed):
        -- find the first such entry and key, and say it with them.
        FOR item IN
            SELECT a.at - 1 AS at, k.key, k.value #>> '{}' AS text
              FROM jsonb_array_elements(jobs) WITH ORDINALITY AS a(entry, at),
                   LATERAL jsonb_each(a.entry) AS k(key, value)
             WHERE jsonb_typeof(a.entry) = 'object' AND jsonb_typeof(k.value) <> 'null'
               AND k.key IN ('idempotent', 'paused', 'recoverable', 'alert', 'retries',
                             'keep_last', 'timeout', 'retry_backoff', 'retry_max_delay',
                             'misfire_grace', 'retention')
             ORDER BY a.at, k.key
        LOOP
            cast_to := CASE WHEN item.key IN ('retries', 'keep_last') THEN 'integer'
                            WHEN item.key IN ('idempotent', 'paused', 'recoverable', 'alert')
                              THEN 'boolean'
                            ELSE 'interval' END;
            BEGIN
                EXECUTE format('SELECT %L::%s', item.text, cast_to);
            EXCEPTION WHEN OTHERS THEN
                RAISE EXCEPTION 'jobs[%].%: %', item.at, item.key, SQLERRM
                    USING ERRCODE = 'invalid_parameter_value', COLUMN = 'jobs';
            END;
        END LOOP;
        RAISE;  -- (none found: the error as it came, every field of it)
    END;
END
$$;
