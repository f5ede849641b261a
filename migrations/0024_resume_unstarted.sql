-- A paused run that never started, resumed by its job's tick (2026-12-02).
--
-- An operator may pause a recoverable job's queued run (pause_run, 0012): it is paused
-- with no start. A trigger resumes it through _claim's queued-run branch, which sets
-- started_at = coalesce(started_at, now()) and counts a resume only for a run that had
-- started. The tick's branch (a deadline of a job whose run is paused), in _claim (0020)
-- and _claim_many (0021), set neither: such a run ran and settled with no start at all
-- (the settlement keeps the stored start of a resumed run, and this one counted as
-- resumed), so its history showed no start and no duration. Both functions are
-- redefined here with the trigger's rule in the tick's branch; nothing else changes.
-- Every PL/pgSQL function runs with enable_seqscan = off (0004).

CREATE OR REPLACE FUNCTION coordinator._claim(
    p_job_id        bigint,
    p_run_id        bigint,       -- the queued run of a manual or retry dispatch, NULL for a deadline
    p_scheduled_for timestamptz,  -- the armed deadline (scheduled), or the armed due time (retry)
    p_version       integer,      -- schedule_version the deadline was armed for
    p_instance      text,
    p_workers       text[],       -- worker types currently served
    p_leader_pid    integer,      -- backend pid holding the single-writer lock, or NULL
    p_lock_class    integer,
    p_lock_obj      integer,
    p_now           timestamptz DEFAULT NULL,  -- the daemon's clock (NULL: no misfire)
    p_skip_next     timestamptz DEFAULT NULL,  -- the deadline after p_now (saved if misfired)
    OUT reason           text,
    OUT run_id           bigint,
    OUT trigger          text,
    OUT args             jsonb,
    OUT attempt          integer,
    OUT scheduled_for    timestamptz,
    OUT claimed_at       timestamptz,
    OUT namespace        text,
    OUT name             text,
    OUT schedule_kind    text,
    OUT schedule         text,
    OUT timezone         text,
    OUT target           jsonb,
    OUT params           jsonb,
    OUT timeout          interval,
    OUT priority         text,
    OUT idempotent       boolean,
    OUT schedule_version integer,
    OUT next_run_at      timestamptz,
    OUT retries          integer,
    OUT retry_backoff    interval,
    OUT retry_max_delay  interval,
    OUT misfire          text,
    OUT misfire_grace    interval,
    OUT recoverable      boolean,
    OUT cursor           jsonb,
    OUT count            bigint,
    OUT resumes          integer
)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    j coordinator.jobs;
    r coordinator.runs;
BEGIN
    IF p_leader_pid IS NOT NULL THEN
        -- The fence, held until this claim commits (0018): a takeover's sweep waits for
        -- it, so a run claimed here is either seen by that sweep or never claimed.
        PERFORM pg_advisory_xact_lock_shared(p_lock_class, p_lock_obj + 1);
        -- The leader's session holds (class, -its pid) while it leads (0020): a probe of
        -- that lock is the whole check. Only when the probe finds nobody there (the
        -- session is gone, or a daemon older than 0020 leads) is pg_locks read.
        IF pg_try_advisory_xact_lock_shared(p_lock_class, -p_leader_pid) THEN
            IF NOT EXISTS (
                SELECT 1 FROM pg_locks l
                 WHERE l.locktype = 'advisory' AND l.pid = p_leader_pid AND l.granted
                   AND l.classid = p_lock_class::oid AND l.objid = p_lock_obj::oid
                   AND l.objsubid = 2
            ) THEN
                reason := 'fenced';
                RETURN;
            END IF;
        END IF;
    END IF;

    SELECT * INTO j FROM coordinator.jobs WHERE id = p_job_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        reason := 'gone';
        RETURN;
    END IF;

    IF p_run_id IS NOT NULL THEN
        SELECT * INTO r FROM coordinator.runs WHERE id = p_run_id AND job_id = p_job_id FOR UPDATE;
        IF NOT FOUND THEN
            reason := 'gone';
            RETURN;
        ELSIF r.status <> 'queued' THEN
            reason := 'not_queued';
            RETURN;
        END IF;
    END IF;

    IF j.paused THEN
        reason := 'paused';
    ELSIF j.invalid_reason IS NOT NULL THEN
        reason := 'invalid';
    ELSIF p_run_id IS NOT NULL AND r.due_at > coalesce(p_scheduled_for, p_now, now()) THEN
        reason := 'not_due';
    ELSIF p_run_id IS NULL AND j.schedule_version <> p_version THEN
        reason := 'version';
    ELSIF p_run_id IS NULL AND j.next_run_at IS DISTINCT FROM p_scheduled_for THEN
        -- (Not compared with now(): the daemon's clock decided the deadline is due, and a
        -- database clock a little behind must not refuse it.)
        reason := 'deadline';
    ELSIF p_run_id IS NULL AND j.misfire = 'skip' AND p_now - p_scheduled_for > j.misfire_grace THEN
        UPDATE coordinator.jobs SET next_run_at = p_skip_next, updated_at = now()
         WHERE id = j.id;
        reason := 'misfire';
        scheduled_for := p_scheduled_for;
        schedule_version := j.schedule_version;
        next_run_at := p_skip_next;
        RETURN;
    ELSIF j.target->>'kind' = 'worker'
          AND NOT ((j.target->>'type') = ANY (coalesce(p_workers, '{}'))) THEN
        reason := 'unavailable';
    END IF;
    IF reason IS NOT NULL THEN
        RETURN;
    END IF;

    IF p_run_id IS NOT NULL THEN
        -- A queued run that started before is a resume (a trigger of a paused run): it
        -- keeps its first start.
        UPDATE coordinator.runs
           SET status = 'running', claimed_at = now(), started_at = coalesce(started_at, now()),
               instance = p_instance, schedule_version = j.schedule_version,
               resumes = runs.resumes + CASE WHEN runs.started_at IS NULL THEN 0 ELSE 1 END,
               paused_at = NULL, error_cause = NULL, error_message = NULL
         WHERE id = p_run_id
        RETURNING * INTO r;
    ELSE
        SELECT * INTO r FROM coordinator.runs
         WHERE job_id = j.id AND status = 'paused' FOR UPDATE;
        IF FOUND THEN
            -- The tick resumes the paused run; it serves this deadline now.
            UPDATE coordinator.runs
               SET status = 'running', claimed_at = now(), instance = p_instance,
                   started_at = coalesce(runs.started_at, now()),
                   schedule_version = j.schedule_version, scheduled_for = p_scheduled_for,
                   resumes = runs.resumes
                             + CASE WHEN runs.started_at IS NULL THEN 0 ELSE 1 END,
                   paused_at = NULL, error_cause = NULL, error_message = NULL
             WHERE id = r.id
            RETURNING * INTO r;
        ELSE
            INSERT INTO coordinator.runs (job_id, trigger, status, scheduled_for, claimed_at,
                                          started_at, schedule_version, instance)
            VALUES (j.id, 'schedule', 'running', p_scheduled_for, now(), now(),
                    j.schedule_version, p_instance)
            ON CONFLICT (job_id)
               WHERE status IN ('queued', 'pending', 'running', 'unresolved', 'cancel_requested',
                                'paused')
            DO NOTHING
            RETURNING * INTO r;
            IF r.id IS NULL THEN
                reason := 'outstanding';
                RETURN;
            END IF;
        END IF;
    END IF;

    run_id := r.id;
    trigger := r.trigger;
    args := r.args;
    attempt := r.attempt;
    scheduled_for := r.scheduled_for;
    claimed_at := r.claimed_at;
    namespace := j.namespace;
    name := j.name;
    schedule_kind := j.schedule_kind;
    schedule := j.schedule;
    timezone := j.timezone;
    target := j.target;
    params := j.params;
    timeout := j.timeout;
    priority := j.priority;
    idempotent := j.idempotent;
    schedule_version := j.schedule_version;
    next_run_at := j.next_run_at;
    retries := j.retries;
    retry_backoff := j.retry_backoff;
    retry_max_delay := j.retry_max_delay;
    misfire := j.misfire;
    misfire_grace := j.misfire_grace;
    recoverable := j.recoverable;
    cursor := r.cursor;
    count := r.count;
    resumes := r.resumes;
END
$$;

CREATE OR REPLACE FUNCTION coordinator._claim_many(
    p_items      text,      -- [{"i": index, "job": id, "run": id|null, "at": ts|null, "v": n|null,
                            --   "now": ts, "skip": ts|null}]
    p_instance   text,
    p_workers    text[],
    p_leader_pid integer,
    p_lock_class integer,
    p_lock_obj   integer
) RETURNS TABLE (
    i                integer,
    err_state        text,
    err_message      text,
    reason           text,
    run_id           bigint,
    trigger          text,
    args             jsonb,
    attempt          integer,
    scheduled_for    timestamptz,
    claimed_at       timestamptz,
    namespace        text,
    name             text,
    schedule_kind    text,
    schedule         text,
    timezone         text,
    target           jsonb,
    params           jsonb,
    timeout          interval,
    priority         text,
    idempotent       boolean,
    schedule_version integer,
    next_run_at      timestamptz,
    retries          integer,
    retry_backoff    interval,
    retry_max_delay  interval,
    misfire          text,
    misfire_grace    interval,
    recoverable      boolean,
    cursor           jsonb,
    count            bigint,
    resumes          integer
)
LANGUAGE plpgsql SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS $$
-- (OUT columns share names with table columns: in SQL here names mean the columns.)
#variable_conflict use_column
DECLARE
    items    json := p_items::json;
    -- The items, one array per field, in job id order (the order rows are locked in).
    a_i      integer[];
    a_job    bigint[];
    a_run    bigint[];
    a_at     timestamptz[];
    a_v      integer[];
    a_now    timestamptz[];
    a_skip   timestamptz[];
    a_why    text[];                 -- each item's refusal (NULL: granted)
    n_items  integer;
    n_jobs   integer;
    n_twice  integer;                -- runs named by more than one item
    locked   coordinator.jobs[];     -- the jobs as locked
    queued   coordinator.runs[];     -- the items' queued runs as locked
    claimed  coordinator.runs[] := '{}';
    more     coordinator.runs[];
    -- What to write: misfired deadlines (job, the deadline saved in its place); queued
    -- runs to promote (run, its job's schedule version); paused runs to resume and new
    -- runs to insert (job, deadline, schedule version).
    m_job    bigint[];
    m_skip   timestamptz[];
    p_run    bigint[];
    p_ver    integer[];
    r_job    bigint[];
    r_at     timestamptz[];
    r_ver    integer[];
    n_job    bigint[];
    n_at     timestamptz[];
    n_ver    integer[];
BEGIN
    -- Fencing once for the batch (each item would otherwise scan pg_locks again), under
    -- the fence held until the batch commits (0018; see coordinator._claim).
    IF p_leader_pid IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock_shared(p_lock_class, p_lock_obj + 1);
    END IF;
    IF p_leader_pid IS NOT NULL
       -- (CASE: the probe first, pg_locks only when it finds nobody; as in _claim.)
       AND (CASE WHEN pg_try_advisory_xact_lock_shared(p_lock_class, -p_leader_pid)
                 THEN NOT EXISTS (
                     SELECT 1 FROM pg_locks l
                      WHERE l.locktype = 'advisory' AND l.pid = p_leader_pid AND l.granted
                        AND l.classid = p_lock_class::oid AND l.objid = p_lock_obj::oid
                        AND l.objsubid = 2)
                 ELSE false END)
    THEN
        RETURN QUERY SELECT x.i, NULL::text, NULL::text, 'fenced'::text, NULL::bigint,
                            NULL::text, NULL::jsonb, NULL::integer, NULL::timestamptz,
                            NULL::timestamptz, NULL::text, NULL::text, NULL::text, NULL::text,
                            NULL::text, NULL::jsonb, NULL::jsonb, NULL::interval, NULL::text,
                            NULL::boolean, NULL::integer, NULL::timestamptz,
                            NULL::integer, NULL::interval, NULL::interval, NULL::text,
                            NULL::interval, NULL::boolean, NULL::jsonb, NULL::bigint,
                            NULL::integer
                       FROM json_to_recordset(items) AS x(i integer);
        RETURN;
    END IF;

    -- (In the order they came: the rows are locked below in job id order whatever
    -- this order is, and the answer is sorted at the end.)
    SELECT array_agg(x.i), array_agg(x.job), array_agg(x.run), array_agg(x.at),
           array_agg(x.v), array_agg(x.now), array_agg(x.skip), count(*), count(DISTINCT x.job),
           count(x.run) - count(DISTINCT x.run)
      INTO a_i, a_job, a_run, a_at, a_v, a_now, a_skip, n_items, n_jobs, n_twice
      FROM json_to_recordset(items)
           AS x(i integer, job bigint, run bigint, at timestamptz, v integer,
                now timestamptz, skip timestamptz);
    IF n_items = 0 THEN
        RETURN;
    END IF;

    -- Optimistically, the whole batch in one go; if any item fails, the batch is rolled
    -- back to here and done again item by item, each in a subtransaction of its own
    -- (a subtransaction per item costs more than the batch: only pay it when needed).
    BEGIN
        IF n_items = 1 OR n_jobs < n_items OR n_twice > 0 THEN
            -- One item (a lone trigger on an idle daemon: the set-based statements' fixed
            -- cost, ~2 ms, would be its latency), two items of one job or run (the second
            -- sees what the first did), or an item without a job: item by item, as before.
            RETURN QUERY SELECT * FROM coordinator._claim_each(items, p_instance, p_workers,
                                                               false);
            RETURN;
        END IF;

        -- The jobs' row locks, in job id order; then the queued runs' (each only if it is
        -- its item's job's, as _claim locks it). Both read as locked.
        SELECT coalesce(array_agg(s.j), '{}') INTO locked
          FROM (SELECT j FROM coordinator.jobs j WHERE j.id = ANY (a_job) ORDER BY j.id
                   FOR NO KEY UPDATE OF j) s;
        IF cardinality(array_remove(a_run, NULL)) > 0 THEN
            SELECT coalesce(array_agg(s.r), '{}') INTO queued
              FROM (SELECT r FROM coordinator.runs r
                     WHERE r.id = ANY (a_run)
                       AND r.job_id = a_job[array_position(a_run, r.id)]
                     ORDER BY r.id FOR UPDATE OF r) s;
        ELSE
            queued := '{}';
        END IF;

        -- Each item's outcome, as _claim decides it, from the rows as locked; and what to
        -- write for it.
        SELECT array_agg(d.why ORDER BY d.o),
               array_agg(d.job) FILTER (WHERE d.why = 'misfire'),
               array_agg(d.skip) FILTER (WHERE d.why = 'misfire'),
               array_agg(d.run) FILTER (WHERE d.why IS NULL AND d.run IS NOT NULL),
               array_agg(d.ver) FILTER (WHERE d.why IS NULL AND d.run IS NOT NULL),
               array_agg(d.job) FILTER (WHERE d.why IS NULL AND d.run IS NULL AND d.held),
               array_agg(d.at) FILTER (WHERE d.why IS NULL AND d.run IS NULL AND d.held),
               array_agg(d.ver) FILTER (WHERE d.why IS NULL AND d.run IS NULL AND d.held),
               array_agg(d.job) FILTER (WHERE d.why IS NULL AND d.run IS NULL AND NOT d.held),
               array_agg(d.at) FILTER (WHERE d.why IS NULL AND d.run IS NULL AND NOT d.held),
               array_agg(d.ver) FILTER (WHERE d.why IS NULL AND d.run IS NULL AND NOT d.held)
          INTO a_why, m_job, m_skip, p_run, p_ver, r_job, r_at, r_ver, n_job, n_at, n_ver
          FROM (
            SELECT x.o, x.job, x.run, x.at, x.skip, j.schedule_version AS ver,
                   CASE
                       WHEN j.id IS NULL THEN 'gone'
                       WHEN x.run IS NOT NULL AND r.id IS NULL THEN 'gone'
                       WHEN x.run IS NOT NULL AND r.status <> 'queued' THEN 'not_queued'
                       WHEN j.paused THEN 'paused'
                       WHEN j.invalid_reason IS NOT NULL THEN 'invalid'
                       WHEN x.run IS NOT NULL
                            AND r.due_at > coalesce(x.at, x.now, now()) THEN 'not_due'
                       WHEN x.run IS NULL AND j.schedule_version <> x.v THEN 'version'
                       -- (Not compared with now(): the daemon's clock decided the
                       -- deadline is due, and a database clock a little behind must not
                       -- refuse it.)
                       WHEN x.run IS NULL AND j.next_run_at IS DISTINCT FROM x.at THEN 'deadline'
                       WHEN x.run IS NULL AND j.misfire = 'skip'
                            AND x.now - x.at > j.misfire_grace THEN 'misfire'
                       WHEN j.target->>'kind' = 'worker'
                            AND NOT ((j.target->>'type') = ANY (coalesce(p_workers, '{}')))
                            THEN 'unavailable'
                   END AS why,
                   -- A deadline of a job whose run is paused resumes that run.
                   x.run IS NULL AND j.id IS NOT NULL AND EXISTS (
                       SELECT 1 FROM coordinator.runs p
                        WHERE p.job_id = x.job AND p.status = 'paused') AS held
              FROM unnest(a_job, a_run, a_at, a_v, a_now, a_skip) WITH ORDINALITY
                   AS x(job, run, at, v, now, skip, o)
              LEFT JOIN unnest(locked) AS j ON j.id = x.job
              LEFT JOIN unnest(queued) AS r ON r.id = x.run AND r.job_id = x.job
            -- (OFFSET 0: each item's outcome computed once, not once per aggregate.)
            OFFSET 0
          ) d;

        -- A misfired deadline: the one after the daemon's clock is saved in its place.
        IF m_job IS NOT NULL THEN
            UPDATE coordinator.jobs
               SET next_run_at = m_skip[array_position(m_job, jobs.id)], updated_at = now()
             WHERE jobs.id = ANY (m_job);
        END IF;

        -- Queued manual and retry runs: promoted. (A queued run that started before is a
        -- resume, a trigger of a paused run: it keeps its first start.)
        IF p_run IS NOT NULL THEN
            WITH u AS (
                UPDATE coordinator.runs
                   SET status = 'running', claimed_at = now(),
                       started_at = coalesce(runs.started_at, now()),
                       instance = p_instance,
                       schedule_version = p_ver[array_position(p_run, runs.id)],
                       resumes = runs.resumes
                                 + CASE WHEN runs.started_at IS NULL THEN 0 ELSE 1 END,
                       paused_at = NULL, error_cause = NULL, error_message = NULL
                 WHERE runs.id = ANY (p_run)
                RETURNING runs
            )
            SELECT claimed || coalesce(array_agg(u.runs), '{}') INTO claimed FROM u;
        END IF;

        -- Deadlines of jobs whose run is paused: the tick resumes it; it serves this
        -- deadline now.
        IF r_job IS NOT NULL THEN
            WITH u AS (
                UPDATE coordinator.runs
                   SET status = 'running', claimed_at = now(), instance = p_instance,
                       started_at = coalesce(runs.started_at, now()),
                       schedule_version = r_ver[array_position(r_job, runs.job_id)],
                       scheduled_for = r_at[array_position(r_job, runs.job_id)],
                       resumes = runs.resumes
                                 + CASE WHEN runs.started_at IS NULL THEN 0 ELSE 1 END,
                       paused_at = NULL, error_cause = NULL, error_message = NULL
                 WHERE runs.job_id = ANY (r_job) AND runs.status = 'paused'
                RETURNING runs
            )
            SELECT coalesce(array_agg(u.runs), '{}') INTO more FROM u;
            claimed := claimed || more;
            IF cardinality(more) < cardinality(r_job) THEN
                -- A paused run changed meanwhile (cancelled, say): a new run instead, as
                -- _claim would find no paused run and insert one.
                SELECT n_job || array_agg(x.job), n_at || array_agg(x.at),
                       n_ver || array_agg(x.ver)
                  INTO n_job, n_at, n_ver
                  FROM unnest(r_job, r_at, r_ver) AS x(job, at, ver)
                 WHERE NOT EXISTS (SELECT 1 FROM unnest(more) AS m WHERE m.job_id = x.job);
            END IF;
        END IF;

        -- Other deadlines: a new run, unless one is outstanding (the partial unique index
        -- decides, whatever races).
        IF n_job IS NOT NULL THEN
            WITH u AS (
                INSERT INTO coordinator.runs AS n (job_id, trigger, status, scheduled_for,
                                                   claimed_at, started_at, schedule_version,
                                                   instance)
                SELECT x.job, 'schedule', 'running', x.at, now(), now(), x.ver, p_instance
                  FROM unnest(n_job, n_at, n_ver) AS x(job, at, ver)
                 ORDER BY x.job
                ON CONFLICT (job_id)
                   WHERE status IN ('queued', 'pending', 'running', 'unresolved',
                                    'cancel_requested', 'paused')
                DO NOTHING
                RETURNING n
            )
            SELECT claimed || coalesce(array_agg(u.n), '{}') INTO claimed FROM u;
        END IF;

        RETURN QUERY
        SELECT x.i, NULL::text, NULL::text,
               CASE WHEN x.why IS NULL AND c.id IS NULL THEN 'outstanding' ELSE x.why END,
               c.id, c.trigger, c.args, c.attempt,
               CASE WHEN x.why = 'misfire' THEN x.at ELSE c.scheduled_for END,
               c.claimed_at,
               CASE WHEN c.id IS NOT NULL THEN j.namespace END,
               CASE WHEN c.id IS NOT NULL THEN j.name END,
               CASE WHEN c.id IS NOT NULL THEN j.schedule_kind END,
               CASE WHEN c.id IS NOT NULL THEN j.schedule END,
               CASE WHEN c.id IS NOT NULL THEN j.timezone END,
               CASE WHEN c.id IS NOT NULL THEN j.target END,
               CASE WHEN c.id IS NOT NULL THEN j.params END,
               CASE WHEN c.id IS NOT NULL THEN j.timeout END,
               CASE WHEN c.id IS NOT NULL THEN j.priority END,
               CASE WHEN c.id IS NOT NULL THEN j.idempotent END,
               CASE WHEN c.id IS NOT NULL OR x.why = 'misfire' THEN j.schedule_version END,
               CASE WHEN x.why = 'misfire' THEN x.skip
                    WHEN c.id IS NOT NULL THEN j.next_run_at END,
               CASE WHEN c.id IS NOT NULL THEN j.retries END,
               CASE WHEN c.id IS NOT NULL THEN j.retry_backoff END,
               CASE WHEN c.id IS NOT NULL THEN j.retry_max_delay END,
               CASE WHEN c.id IS NOT NULL THEN j.misfire END,
               CASE WHEN c.id IS NOT NULL THEN j.misfire_grace END,
               CASE WHEN c.id IS NOT NULL THEN j.recoverable END,
               c.cursor, c.count, c.resumes
          FROM unnest(a_i, a_job, a_at, a_skip, a_why) AS x(i, job, at, skip, why)
          LEFT JOIN unnest(claimed) AS c ON c.job_id = x.job
          LEFT JOIN unnest(locked) AS j ON j.id = x.job
         -- (The order of 0015: by job, then item.)
         ORDER BY x.job, x.i;
    EXCEPTION WHEN others THEN
        RETURN QUERY SELECT * FROM coordinator._claim_each(items, p_instance, p_workers, true);
    END;
END
$$;
