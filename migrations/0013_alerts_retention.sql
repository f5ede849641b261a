-- Alerts and retention, version 13 (issue #16): be told, stay tidy.
--
-- Jobs gain four columns:
--   alert       false: no failure alert is ever sent for the job (--no-alert, alert = false)
--   keep_last   retention keeps at most this many of the job's newest runs (NULL: the
--               daemon's default, 100)
--   retention   how long the job's finished runs are kept (NULL: the daemon's `retention`
--               setting, 30 days by default)
--   removed_at  set by remove(..., keep_history => true): the job is hidden (every read
--               and every SQL API function ignores it), disarmed and paused, and its runs
--               stay until retention takes them; then the row itself goes. Its name is
--               free at once: (namespace, name) is unique among live jobs only.
--
-- Retention (the daemon's prune, `coordinator prune`): a run is deleted when it is
-- finished (succeeded, failed, timed_out or cancelled: never queued, pending, running,
-- unresolved, nor any state added later) and either beyond its job's keep_last newest
-- runs or finished before now - retention; a job's latest run is never deleted, unless
-- the job was removed. Deletes go in bounded batches, one short transaction each
-- (_prune); the daemon yields between them.
--
-- Alert windows: at most one alert per (job, kind) per window. The last alert's time is
-- kept here, so a daemon that restarts (or crash-loops) inside a window stays quiet;
-- _alert_open writes only when an alert is due, and counts the ones suppressed since the
-- last alert from the runs themselves (nothing is written for a suppressed alert).
--
-- Redefined here, each from its latest definition: define_job (0012: three new parameters,
-- dropped and re-created), sync (0012: reads the new keys; removed jobs are not counted
-- as existing), _job_id (0005: removed jobs are unknown), remove (0001: a third parameter,
-- keep_history; dropped and re-created).
-- New: _alert_open, _prunable, _prune, _prune_preview.
-- Every function runs with enable_seqscan = off (0004).

ALTER TABLE coordinator.jobs
    ADD COLUMN alert boolean NOT NULL DEFAULT true,
    ADD COLUMN keep_last integer CONSTRAINT jobs_keep_last_check
        CHECK (keep_last BETWEEN 1 AND 1000000000),
    ADD COLUMN retention interval CONSTRAINT jobs_retention_check
        CHECK (retention > interval '0' AND retention <= interval '3650 days'),
    ADD COLUMN removed_at timestamptz;

-- Names are unique among live jobs: a job removed with its history kept frees its name.
ALTER TABLE coordinator.jobs DROP CONSTRAINT jobs_namespace_name_key;
CREATE UNIQUE INDEX jobs_namespace_name_key ON coordinator.jobs (namespace, name)
    WHERE removed_at IS NULL;

CREATE TABLE coordinator.alert_windows (
    job_id  bigint NOT NULL REFERENCES coordinator.jobs (id) ON DELETE CASCADE,
    -- failed: a run ended failed or timed out with no retry left (its retries exhausted,
    -- or none allowed); unresolved: a run was
    -- left unresolved by a crash; findings: a run recorded findings of severity error or
    -- data_loss.
    kind    text NOT NULL CHECK (kind IN ('failed', 'unresolved', 'findings')),
    -- When the last alert was sent, and the run it was about (later runs have larger
    -- ids: the suppressed ones are counted from there).
    sent_at timestamptz NOT NULL,
    run_id  bigint NOT NULL,
    PRIMARY KEY (job_id, kind)
);

-- ---------------------------------------------------------------------------------------
-- The SQL API.
-- ---------------------------------------------------------------------------------------

-- As in 0005, plus: a removed job is unknown.
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
         WHERE namespace = p_namespace AND name = p_name AND removed_at IS NULL
           FOR NO KEY UPDATE;
    ELSE
        SELECT id INTO found_id FROM coordinator.jobs
         WHERE namespace = p_namespace AND name = p_name AND removed_at IS NULL;
    END IF;
    IF found_id IS NULL THEN
        RAISE EXCEPTION 'unknown job %/%', p_namespace, p_name
            USING ERRCODE = 'no_data_found', HINT = 'coordinator.job_not_found';
    END IF;
    RETURN found_id;
END
$$;

-- As in 0012, plus alert, keep_last and retention (replaced like every other field).
DROP FUNCTION coordinator.define_job(text, text, jsonb, text, text, text, jsonb, interval,
                                     text, boolean, boolean, text, integer, interval, interval,
                                     text, interval, boolean);
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

-- As in 0012, plus the keys alert, keep_last and retention; a removed job of the same
-- name does not count as existing.
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
        SELECT j.sync_paused INTO was_sync_paused FROM coordinator.jobs j
         WHERE j.namespace = namespace AND j.name = entry->>'name' AND j.removed_at IS NULL;
        IF FOUND THEN
            n_updated := n_updated + 1;
        ELSE
            n_created := n_created + 1;
        END IF;
        PERFORM coordinator.define_job(
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
            paused          => coalesce((entry->>'paused')::boolean,
                                        CASE WHEN was_sync_paused THEN false END),
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
        names := names || (entry->>'name');
    END LOOP;
    UPDATE coordinator.jobs j SET paused = true, sync_paused = true, updated_at = now()
     WHERE j.namespace = namespace AND j.removed_at IS NULL AND NOT j.paused
       AND NOT (j.name = ANY (names));
    GET DIAGNOSTICS n_paused = ROW_COUNT;
    PERFORM set_config('coordinator.origin', coalesce(previous_origin, ''), true);
    IF NOT coordinator._wakes_suppressed() THEN
        PERFORM pg_notify('coordinator', json_build_object('sync', namespace)::text);
    END IF;
    RETURN QUERY SELECT n_created, n_updated, n_paused;
END
$$;

-- Remove a job. By default with its run history (a call still running settles into
-- nothing). With keep_history: the job is hidden (unknown to every function and read),
-- disarmed and paused, its queued or paused run cancelled; its runs stay until retention takes
-- them, and a call still running settles into that history. The schedule version is
-- bumped so that no deadline claim or settlement of the old schedule can re-arm it.
DROP FUNCTION coordinator.remove(text, text);
CREATE FUNCTION coordinator.remove(namespace text, name text, keep_history boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql SET enable_seqscan = off AS $$
#variable_conflict use_variable
DECLARE
    jid bigint := coordinator._job_id(namespace, name, true);
BEGIN
    PERFORM coordinator._require(keep_history, 'keep_history');
    IF NOT keep_history THEN
        DELETE FROM coordinator.jobs WHERE id = jid;
        RETURN;
    END IF;
    UPDATE coordinator.runs
       SET status = 'cancelled', finished_at = now(),
           error_message = 'cancelled: the job was removed (history kept)'
     WHERE job_id = jid AND status IN ('queued', 'paused');
    UPDATE coordinator.jobs
       SET removed_at = now(), paused = true, next_run_at = NULL,
           schedule_version = schedule_version + 1, updated_at = now()
     WHERE id = jid;
END
$$;

-- ---------------------------------------------------------------------------------------
-- Alerts (the daemon's): at most one per (job, kind) per window.
-- ---------------------------------------------------------------------------------------

-- Called by the daemon when an alert of p_kind about run p_run_id may be due, with its
-- own clock's p_now. Returns one row:
--   outcome       due (the window is open now: sent_at written), inside (an alert was
--                 sent less than p_window ago: nothing written), opted_out (the job says
--                 alert = false), gone (the job was removed)
--   namespace, name  the job's
--   until         when the current window ends (due, inside)
--   previous      when the alert before this one was sent (due; NULL: never)
--   suppressed    alerts of this kind suppressed since then (due), counted from the runs
CREATE FUNCTION coordinator._alert_open(
    p_job_id bigint,
    p_kind   text,
    p_run_id bigint,
    p_now    timestamptz,
    p_window interval,
    OUT outcome    text,
    OUT namespace  text,
    OUT name       text,
    OUT until      timestamptz,
    OUT previous   timestamptz,
    OUT suppressed bigint
)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    j coordinator.jobs;
    w coordinator.alert_windows;
BEGIN
    SELECT * INTO j FROM coordinator.jobs WHERE id = p_job_id;
    IF NOT FOUND OR j.removed_at IS NOT NULL THEN
        outcome := 'gone';
        RETURN;
    END IF;
    namespace := j.namespace;
    name := j.name;
    IF NOT j.alert THEN
        outcome := 'opted_out';
        RETURN;
    END IF;
    SELECT * INTO w FROM coordinator.alert_windows
     WHERE job_id = p_job_id AND kind = p_kind FOR UPDATE;
    IF FOUND AND w.sent_at > p_now - p_window THEN
        outcome := 'inside';
        until := w.sent_at + p_window;
        RETURN;
    END IF;
    outcome := 'due';
    until := p_now + p_window;
    suppressed := 0;
    IF FOUND THEN
        previous := w.sent_at;
        -- Runs after the one the last alert was about (ids grow with time), through the
        -- job's index.
        IF p_kind = 'failed' THEN
            -- Failed attempts that a retry followed were never alerts (0007: retry_of).
            SELECT count(*) INTO suppressed FROM coordinator.runs r
             WHERE r.job_id = p_job_id AND r.id > w.run_id AND r.id <> p_run_id
               AND r.status IN ('failed', 'timed_out')
               AND r.error_cause IS DISTINCT FROM 'lost'
               AND r.finished_at > w.sent_at AND r.finished_at <= p_now
               AND NOT EXISTS (SELECT 1 FROM coordinator.runs n WHERE n.retry_of = r.id);
        ELSIF p_kind = 'findings' THEN
            SELECT count(*) INTO suppressed FROM coordinator.runs r
             WHERE r.job_id = p_job_id AND r.id > w.run_id AND r.id <> p_run_id
               AND (r.finding_counts ? 'error' OR r.finding_counts ? 'data_loss');
        ELSIF p_kind = 'unresolved' THEN
            SELECT count(*) INTO suppressed FROM coordinator.runs r
             WHERE r.job_id = p_job_id AND r.id > w.run_id AND r.id <> p_run_id
               AND r.error_cause = 'lost';
        END IF;
    END IF;
    INSERT INTO coordinator.alert_windows AS a (job_id, kind, sent_at, run_id)
    VALUES (p_job_id, p_kind, p_now, p_run_id)
    ON CONFLICT (job_id, kind) DO UPDATE SET sent_at = excluded.sent_at, run_id = excluded.run_id;
END
$$;

-- ---------------------------------------------------------------------------------------
-- Retention.
-- ---------------------------------------------------------------------------------------

-- The runs of one job retention may delete, oldest first, after run p_after, at most
-- p_limit (NULL: all): finished, not the job's latest run (unless p_removed), and beyond
-- the p_keep newest runs or finished before p_cutoff. Everything goes through the job's
-- index (runs_by_job): the rows looked at are the deletable ones plus at most p_keep
-- recent ones and the job's outstanding run.
CREATE FUNCTION coordinator._prunable(
    p_job_id  bigint,
    p_after   bigint,
    p_keep    integer,
    p_cutoff  timestamptz,
    p_removed boolean,
    p_limit   integer
) RETURNS SETOF bigint
LANGUAGE plpgsql STABLE SET enable_seqscan = off AS $$
DECLARE
    latest   bigint;
    boundary bigint;
BEGIN
    SELECT r.id INTO latest FROM coordinator.runs r
     WHERE r.job_id = p_job_id ORDER BY r.id DESC LIMIT 1;
    IF latest IS NULL THEN
        RETURN;
    END IF;
    -- Runs with an id up to `boundary` are beyond the p_keep newest.
    SELECT r.id INTO boundary FROM coordinator.runs r
     WHERE r.job_id = p_job_id ORDER BY r.id DESC OFFSET p_keep LIMIT 1;
    RETURN QUERY
        SELECT r.id FROM coordinator.runs r
         WHERE r.job_id = p_job_id AND r.id > p_after
           AND (p_removed OR r.id < latest)
           AND r.status IN ('succeeded', 'failed', 'timed_out', 'cancelled')
           AND (r.id <= boundary OR coalesce(r.finished_at, r.created_at) < p_cutoff)
         ORDER BY r.id
         LIMIT p_limit;
END
$$;

-- One batch of the prune: deletes at most p_limit runs, looking at most at p_max_jobs
-- jobs (by id, from job p_job_id, after its run p_after), and deletes removed jobs that
-- have no run left. One short transaction: the caller yields between batches. Returns
-- where the next batch starts (next_job NULL: the prune is done).
CREATE FUNCTION coordinator._prune(
    p_job_id    bigint,
    p_after     bigint,
    p_limit     integer,
    p_max_jobs  integer,
    p_now       timestamptz,
    p_retention interval,
    p_keep      integer,
    OUT deleted      integer,
    OUT removed_jobs integer,
    OUT jobs_seen    integer,
    OUT next_job     bigint,
    OUT next_after   bigint
)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    j       record;
    victims bigint[];
    budget  integer;
    last_id bigint;
BEGIN
    deleted := 0;
    removed_jobs := 0;
    jobs_seen := 0;
    FOR j IN SELECT jb.id, jb.keep_last, jb.retention, jb.removed_at
               FROM coordinator.jobs jb
              WHERE jb.id >= p_job_id ORDER BY jb.id LIMIT p_max_jobs
    LOOP
        jobs_seen := jobs_seen + 1;
        last_id := j.id;
        budget := p_limit - deleted;
        victims := ARRAY(
            SELECT coordinator._prunable(
                j.id, CASE WHEN j.id = p_job_id THEN p_after ELSE 0 END,
                coalesce(j.keep_last, p_keep), p_now - coalesce(j.retention, p_retention),
                j.removed_at IS NOT NULL, budget));
        IF cardinality(victims) > 0 THEN
            DELETE FROM coordinator.runs WHERE id = ANY (victims);
            deleted := deleted + cardinality(victims);
        END IF;
        IF cardinality(victims) >= budget THEN
            -- The budget is spent: the next batch goes on inside this job.
            next_job := j.id;
            next_after := victims[cardinality(victims)];
            RETURN;
        END IF;
        IF j.removed_at IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM coordinator.runs r WHERE r.job_id = j.id) THEN
            DELETE FROM coordinator.jobs WHERE id = j.id;
            removed_jobs := removed_jobs + 1;
        END IF;
    END LOOP;
    IF jobs_seen >= p_max_jobs THEN
        next_job := last_id + 1;
        next_after := 0;
    END IF;
END
$$;

-- What a prune would delete now, job by job (`coordinator prune --dry-run`): every job
-- with runs, live or removed, its run count, how many would go, and the oldest run kept.
CREATE FUNCTION coordinator._prune_preview(p_now timestamptz, p_retention interval,
                                           p_keep integer)
RETURNS TABLE (job_id bigint, namespace text, name text, removed boolean, runs bigint,
               prunable bigint, keep_last integer, retention interval)
LANGUAGE plpgsql STABLE SET enable_seqscan = off AS $$
DECLARE
    j record;
BEGIN
    FOR j IN SELECT * FROM coordinator.jobs jb ORDER BY jb.namespace, jb.name, jb.id LOOP
        job_id := j.id;
        namespace := j.namespace;
        name := j.name;
        removed := j.removed_at IS NOT NULL;
        keep_last := coalesce(j.keep_last, p_keep);
        retention := coalesce(j.retention, p_retention);
        SELECT count(*) INTO runs FROM coordinator.runs r WHERE r.job_id = j.id;
        SELECT count(*) INTO prunable
          FROM coordinator._prunable(j.id, 0, keep_last, p_now - retention, removed, NULL);
        RETURN NEXT;
    END LOOP;
END
$$;
