-- One sync of a namespace at a time (a tester's finding, 2026-12-03).
--
-- 1. Two syncs of one namespace that overlapped (a worker that declared twice in a row,
--    two programs, or `coordinator sync` beside a worker) each missed the other's rows:
--    the namespace ended with the union of both job sets, or with the older one active
--    and the newer paused, never reliably the later one. sync() and _declare() now take
--    a transaction-level advisory lock on the namespace (class 0x636F6F73, "coos";
--    object hashtext(namespace); the daemon's own locks use class 0x636F6F72), so the
--    second waits for the first to commit and then applies its whole set over it: the
--    last sync wins, whole. Both functions are as before otherwise (sync() as in 0026,
--    _declare() as in 0030), with their settings (enable_seqscan = off, jit = off: 0035).
--    (The daemon applies one connection's declarations in the order they came.)

CREATE OR REPLACE FUNCTION coordinator.sync(namespace text, jobs jsonb)
RETURNS TABLE (created integer, updated integer, paused integer)
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
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
    -- One sync of a namespace at a time, each over the last one's committed result (1).
    PERFORM pg_advisory_xact_lock(1668247411, hashtext(namespace));
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

CREATE OR REPLACE FUNCTION coordinator._declare(p_namespace text, p_jobs jsonb)
RETURNS TABLE (created integer, updated integer, paused integer, unchanged boolean)
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
BEGIN
    -- Taken before the "unchanged" check, so that the check reads what the last sync of
    -- the namespace committed (1); sync() takes it again (it is re-entrant).
    PERFORM pg_advisory_xact_lock(1668247411, hashtext(p_namespace));
    IF NOT EXISTS (
        SELECT 1 FROM jsonb_array_elements(p_jobs) e
         WHERE NOT coordinator._job_unchanged(p_namespace, e))
       AND NOT EXISTS (
        SELECT 1 FROM coordinator.jobs j
         WHERE j.namespace = p_namespace AND j.removed_at IS NULL AND NOT j.paused
           AND NOT (j.name = ANY (ARRAY(SELECT e->>'name' FROM jsonb_array_elements(p_jobs) e))))
    THEN
        RETURN QUERY SELECT 0, 0, 0, true;
        RETURN;
    END IF;
    RETURN QUERY SELECT s.created, s.updated, s.paused, false
                   FROM coordinator.sync(p_namespace, p_jobs) s;
END
$$;
