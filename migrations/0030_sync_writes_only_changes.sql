-- A sync writes only what changed (found by a helper re-syncing a manifest, 2026-12-02).
--
-- coordinator.sync() called define_job for every entry, so syncing an unchanged manifest
-- rewrote every listed row (a new row version, a new updated_at, WAL and a dead tuple
-- each) and woke the daemon to re-read the namespace: a manifest applied on every deploy,
-- or from cron, cost a write per job and a refresh each time. A worker's declaration
-- already wrote nothing when unchanged (_declare, 0014), by one predicate over the whole
-- list.
--
-- Now the predicate is a function of one entry, _job_unchanged (0014's: every field sync
-- would write equals the row's, with define_job's defaults for what the entry leaves
-- out, and its pause as sync would set it; JSON and durations now compared as written,
-- so that 1.0 for 1 in params, or 24 hours for 1 day -- equal as values, not to a worker
-- or across a change of daylight saving time -- is written). _sync skips an unchanged entry
-- (no write) and sends its wake only when it wrote or paused something; _declare asks the
-- same function. The answer is unchanged: "updated" still counts every listed job that
-- existed, as scripts read it.
--
-- Two refusals of sync say more, as README promises of the front doors: jobs that are
-- not an array name the argument (COLUMN 'jobs'), and a value define_job refuses (an
-- interval of zero, a misfire grace without skip...) names its entry, `jobs[1].every:
-- ...`, as a value that does not cast already did (0026), with COLUMN 'jobs'.
--
-- Redefined from their latest definitions: _sync (0022's sync, renamed by 0026) and
-- _declare (0014).

CREATE FUNCTION coordinator._job_unchanged(p_namespace text, e jsonb) RETURNS boolean
LANGUAGE sql STABLE SET enable_seqscan = off AS $$
    SELECT EXISTS (
        SELECT 1 FROM coordinator.jobs j
         WHERE j.namespace = p_namespace AND j.name = e->>'name'
           AND j.removed_at IS NULL
           AND (j.schedule_kind, j.schedule, j.timezone, j.target::text, j.params::text,
                j.timeout::text, j.priority, j.idempotent, j.invalid_reason, j.retries,
                j.retry_backoff::text, j.retry_max_delay::text, j.misfire,
                j.misfire_grace::text, j.recoverable, j.alert, j.keep_last,
                j.retention::text)
               IS NOT DISTINCT FROM
               (e->>'schedule_kind', e->>'schedule', coalesce(e->>'timezone', 'UTC'),
                (e->'target')::text, coalesce(e->'params', '{}')::text,
                (e->>'timeout')::interval::text,
                coalesce(e->>'priority', 'background'),
                coalesce((e->>'idempotent')::boolean, false), e->>'invalid_reason',
                coalesce((e->>'retries')::integer, 0),
                coalesce((e->>'retry_backoff')::interval, interval '30 seconds')::text,
                coalesce((e->>'retry_max_delay')::interval, interval '1 hour')::text,
                coalesce(e->>'misfire', 'run-once'), (e->>'misfire_grace')::interval::text,
                coalesce((e->>'recoverable')::boolean, false),
                coalesce((e->>'alert')::boolean, true), (e->>'keep_last')::integer,
                (e->>'retention')::interval::text)
           AND CASE WHEN e ? 'paused' THEN j.paused = (e->>'paused')::boolean
                    ELSE NOT (j.paused AND j.sync_paused) END)
$$;

-- _declare as in 0014, the per-entry predicate now _job_unchanged.

CREATE OR REPLACE FUNCTION coordinator._declare(p_namespace text, p_jobs jsonb)
RETURNS TABLE (created integer, updated integer, paused integer, unchanged boolean)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
BEGIN
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

-- _sync as in 0022 (then sync(), renamed by 0026), an unchanged entry skipped.

CREATE OR REPLACE FUNCTION coordinator._sync(namespace text, jobs jsonb)
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
    n_written       integer := 0;  -- entries define_job wrote
    refusal         text;
    refusal_state   text;
    refusal_detail  text;
    refusal_hint    text;
BEGIN
    PERFORM coordinator._require(namespace, 'namespace');
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION '%', problem
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'namespace';
    END IF;
    PERFORM coordinator._require(jobs, 'jobs');  -- (NULL: 22004, as README says)
    IF jsonb_typeof(jobs) <> 'array' THEN
        RAISE EXCEPTION 'jobs must be a JSON array'
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'jobs';
    END IF;
    PERFORM set_config('coordinator.origin', 'quiet', true);
    BEGIN
    FOR entry IN SELECT value FROM jsonb_array_elements(jobs) LOOP
        IF jsonb_typeof(entry) IS DISTINCT FROM 'object' THEN
            RAISE EXCEPTION 'jobs[%]: must be a JSON object', entry_index
                USING ERRCODE = 'invalid_parameter_value', COLUMN = 'jobs';
        ELSIF entry->>'name' IS NULL THEN
            RAISE EXCEPTION 'jobs[%].name: required', entry_index
                USING ERRCODE = 'invalid_parameter_value', COLUMN = 'jobs';
        END IF;
        entry_index := entry_index + 1;
        names := names || (entry->>'name');
        IF coordinator._job_unchanged(namespace, entry) THEN
            n_updated := n_updated + 1;  -- (listed and existing: counted as ever)
            CONTINUE;                    -- but nothing to write, nothing to wake
        END IF;
        n_written := n_written + 1;
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
    END LOOP;
    EXCEPTION WHEN invalid_parameter_value OR null_value_not_allowed THEN
        -- define_job's refusal names its argument, not the entry: say which entry
        -- (entry_index is one past it by then), as a value that does not cast is said.
        GET STACKED DIAGNOSTICS refusal = MESSAGE_TEXT, refusal_state = RETURNED_SQLSTATE,
                                refusal_detail = PG_EXCEPTION_DETAIL,
                                refusal_hint = PG_EXCEPTION_HINT;
        IF refusal LIKE 'jobs[%' THEN
            RAISE;
        END IF;
        refusal := format('jobs[%s].%s', entry_index - 1, refusal);
        -- (A DETAIL or HINT the refusal did not have comes back as '': not sent on.)
        IF refusal_detail <> '' AND refusal_hint <> '' THEN
            RAISE EXCEPTION USING MESSAGE = refusal, ERRCODE = refusal_state, COLUMN = 'jobs',
                                  DETAIL = refusal_detail, HINT = refusal_hint;
        ELSIF refusal_detail <> '' THEN
            RAISE EXCEPTION USING MESSAGE = refusal, ERRCODE = refusal_state, COLUMN = 'jobs',
                                  DETAIL = refusal_detail;
        ELSIF refusal_hint <> '' THEN
            RAISE EXCEPTION USING MESSAGE = refusal, ERRCODE = refusal_state, COLUMN = 'jobs',
                                  HINT = refusal_hint;
        END IF;
        RAISE EXCEPTION USING MESSAGE = refusal, ERRCODE = refusal_state, COLUMN = 'jobs';
    END;
    UPDATE coordinator.jobs j SET paused = true, sync_paused = true, updated_at = now()
     WHERE j.namespace = namespace AND j.removed_at IS NULL AND NOT j.paused
       AND NOT (j.name = ANY (names));
    GET DIAGNOSTICS n_paused = ROW_COUNT;
    PERFORM set_config('coordinator.origin', coalesce(previous_origin, ''), true);
    IF n_written + n_paused > 0 AND NOT coordinator._wakes_suppressed() THEN
        PERFORM pg_notify('coordinator', json_build_object('sync', namespace)::text);
        -- (Item 2: define_job ran quiet here; the runs of the jobs it un-paused now.)
        FOREACH job_id IN ARRAY unpaused LOOP
            PERFORM coordinator._dispatch_queued(job_id);
        END LOOP;
    END IF;
    RETURN QUERY SELECT n_created, n_updated, n_paused;
END
$$;

