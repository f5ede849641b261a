-- Cheaper batches (issue #14): the server time per item of the daemon's two hot
-- statements, SELECT * FROM coordinator._claim_many(...) and coordinator._settle_many($1).
--
-- Measured: server time per item (pg_stat_statements total_exec_time / rows, track = top)
-- in a burst of 5,000 no-op manual worker runs through a real daemon (64 slots, batches
-- of ~64; a scratch script, not committed, on bench/common.py's BenchCluster, one cluster per
-- run, the 0020/0015 functions re-created over this file for "before"), six alternating
-- pairs on the shared 2-core machine, in microseconds:
--     _claim_many   before 87 79 102 94 84 68 (median ~86)   after 55 68 61 76 65 55 (~63)
--     _settle_many  before 105 90 111 106 95 78 (~100)       after 64 76 70 78 72 69 (~71)
-- PostgreSQL CPU per run in those bursts: 0.23-0.34 ms before, 0.20-0.26 ms after.
-- Calling the two functions directly (no daemon; 64 manual runs per batch, 80 batches,
-- the two versions in two databases of one cluster, alternating), three runs:
--     _claim_many   64.0 67.3 58.5 -> 55.1 56.3 50.8;  _settle_many  69.9 73.2 64.9 -> 57.7 58.9 52.3
-- (that test keeps few runs outstanding, so the partial-index reads below do not show).
--
-- Where the time went (pg_stat_statements with track = all, perf on the serving backend):
--   * _settle_many's result UPDATE looked each run's item up once per column it sets
--     (a_status[array_position(a_run, runs.id)], twenty array_position() scans of the
--     batch's run ids per row): ~10 us per row, a third of the UPDATE. Now found once per
--     row (a sub-SELECT for the multi-column SET; OFFSET 0 keeps the planner from pulling
--     the lookup up into every column again).
--   * Every aggregate with its own ORDER BY sorts its input again: the items' arrays were
--     built with sixteen (settle) and seven (claim) sorts, and the claim's decision with
--     four more, only to put the items in job id order. Nothing needs that order (the rows
--     are locked by their own statements in key order whatever the arrays' order, and
--     parallel arrays built by one aggregate pass stay aligned): the items stay in the
--     order they came, and the answer is sorted by (job, item) at the end, as before.
--   * The claim's decision was a subquery the planner pulled up into its eleven
--     aggregates: its CASE, and its paused-run EXISTS (as six SubPlans, each initialised
--     at every call), were evaluated once per aggregate. OFFSET 0: once per item.
--   * _settle_many parsed its JSON three times (the json cast, json_array_elements for
--     the run ids, json_to_recordset) and read the items' runs as whole rows only for their
--     job: now parsed once (jsonb), the run ids taken from the parsed value, and only
--     (id, job_id) read. The jobs as locked and the runs as saved are kept as the columns
--     that are read, not as whole-row composites.
--   * Generic plans (plan_cache_mode = force_generic_plan, as _namespaces in 0019): the
--     plan cache kept choosing custom plans for several statements, planning them again
--     at every call, with the PL/pgSQL arrays folded into constants (a subscript of a flat
--     array of text or jsonb walks it from the start; an expanded one does not). The
--     custom plan of the settlement UPDATE also read the whole partial index of
--     outstanding runs (its statuses folded into constants proved that index usable:
--     thousands of entries per batch in a burst), which 0015 meant to rule out. Every
--     statement here reaches its rows by key in its generic plan
--     (tests/integration/test_batch_sets.py, test_stable_plans.py). The setting also
--     applies to what these functions call (the item-by-item fallbacks, row triggers):
--     their statements were written for generic plans too.
--   * Index-only scans: a statement reading only runs.id and runs.job_id may be planned,
--     on tiny tables, as an index-only scan of runs_by_job (job_id, id) filtered on id --
--     the whole index once the table grows. The settlement's run lookup also reads status,
--     which no index holds with those two, so the primary key it is.
-- What stays, per row, is PostgreSQL's own cost of a non-HOT UPDATE of runs (status is in
-- the partial unique index's predicate and in runs_by_job_created, so no status change can
-- be a HOT update): the BEFORE row triggers' tuple lock, three or four index inserts, the
-- CHECK constraints, the WAL; and the JSON decoding of the items (json_to_recordset builds
-- a hash table per object).
--
-- Nothing else changes: same names, arguments and result columns (grants kept), same
-- refusals in the same order of precedence, same row locks in the same order (jobs in id
-- order, then the queued runs in id order), same fencing (once per batch, 0018/0020), same
-- ON CONFLICT on the one-outstanding-run index, same fallbacks (a batch that is not one
-- set, or that fails, goes item by item through _claim_each / _settle_each, unchanged),
-- same rows answered in the same order.
--
-- Redefined here, each from its latest definition: _claim_many (0020) and _settle_many
-- (0015). Every function runs with enable_seqscan = off (0004).

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
                       schedule_version = r_ver[array_position(r_job, runs.job_id)],
                       scheduled_for = r_at[array_position(r_job, runs.job_id)],
                       resumes = runs.resumes + 1, paused_at = NULL, error_cause = NULL,
                       error_message = NULL
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

CREATE OR REPLACE FUNCTION coordinator._settle_many(
    p_items text  -- [{"i", "run", "status", "started", "finished", "count", "extra",
                  --   "cause", "message", "v", "next", "category", "retryable", "jitter",
                  --   "cursor", "findings"}]
) RETURNS TABLE (
    i                integer,
    err_state        text,
    err_message      text,
    outcome          text,
    job_id           bigint,
    paused           boolean,
    invalid          boolean,
    schedule_version integer,
    next_run_at      timestamptz,
    retry_run_id     bigint,
    retry_due_at     timestamptz,
    exhausted        boolean,
    category         text
)
LANGUAGE plpgsql SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS $$
-- (OUT columns share names with table columns: in SQL here names mean the columns.)
#variable_conflict use_column
DECLARE
    items       jsonb := p_items::jsonb;   -- parsed once
    -- A parameter, not constants: see 0015.
    settleable  text[] := '{running,pending,cancel_requested}';
    waiting     text[] := '{queued}';
    f_id        bigint[];             -- the items' runs that exist, and their jobs
    f_job       bigint[];
    n_seen      bigint;               -- (unused: see the first statement)
    -- The items, one array per field, in the order they came (the rows are locked by
    -- the statements below in job id order whatever this order is).
    a_i         integer[];
    a_run       bigint[];
    a_job       bigint[];             -- the run's job (NULL: no such run)
    a_status    text[];
    a_started   timestamptz[];
    a_finished  timestamptz[];
    a_count     bigint[];
    a_extra     jsonb[];
    a_cause     text[];
    a_message   text[];
    a_v         integer[];
    a_next      timestamptz[];
    a_category  text[];
    a_retryable boolean[];
    a_jitter    double precision[];
    a_cursor    jsonb[];              -- {"v": cursor}, or NULL: unchanged
    n_items     integer;
    n_jobs      integer;              -- distinct jobs among the items that have one
    n_orphans   integer;              -- items whose run does not exist
    n_found     integer;              -- items that carry findings
    -- The jobs as locked (only what is read of them).
    j_id        bigint[];
    j_paused    boolean[];
    j_invalid   boolean[];
    j_version   integer[];
    j_next      timestamptz[];
    j_retries   integer[];
    j_backoff   interval[];
    j_maxdelay  interval[];
    j_recover   boolean[];
    -- The runs as saved now (only what is read of them).
    s_id        bigint[];
    s_job       bigint[];
    s_status    text[];
    s_trigger   text[];
    s_sched     timestamptz[];
    s_attempt   integer[];
    s_category  text[];
    s_args      jsonb[];
    s_cursor    jsonb[];
    s_count     bigint[];
    -- The jobs whose deadline moved, as updated.
    m_id        bigint[];
    m_paused    boolean[];
    m_invalid   boolean[];
    m_version   integer[];
    m_next      timestamptz[];
    to_retry    bigint[];             -- saved runs whose job's policy asks for a retry ...
    spent       bigint[];             -- ... and those that used the job's last attempt
    mv_run      bigint[];             -- saved runs that move their job's deadline: run,
    mv_job      bigint[];             -- job, the next deadline
    mv_next     timestamptz[];
    q_of        bigint[];             -- retries queued now: of which run, id, due time
    q_id        bigint[];
    q_due       timestamptz[];
BEGIN
    -- The items' runs (by their key only, in a statement of its own: joined to the items,
    -- a plan made on tiny tables could read a whole index in key order for a merge join).
    -- (count(r.status): no index holds id, job_id and status together, so no plan reads
    -- an index whole instead of the table, whatever the statistics.)
    SELECT array_agg(r.id), array_agg(r.job_id), count(r.status) INTO f_id, f_job, n_seen
      FROM coordinator.runs r
     WHERE r.id = ANY (ARRAY(SELECT (e->>'run')::bigint FROM jsonb_array_elements(items) e));
    SELECT array_agg(x.i), array_agg(x.run), array_agg(r.job_id), array_agg(x.status),
           array_agg(x.started), array_agg(x.finished), array_agg(x.count),
           array_agg(x.extra), array_agg(x.cause), array_agg(x.message), array_agg(x.v),
           array_agg(x.next), array_agg(x.category), array_agg(x.retryable),
           array_agg(x.jitter), array_agg(x.cursor),
           count(*), count(DISTINCT r.job_id), count(*) FILTER (WHERE r.job_id IS NULL),
           count(*) FILTER (WHERE x.findings IS NOT NULL)
      INTO a_i, a_run, a_job, a_status, a_started, a_finished, a_count, a_extra, a_cause,
           a_message, a_v, a_next, a_category, a_retryable, a_jitter, a_cursor,
           n_items, n_jobs, n_orphans, n_found
      FROM jsonb_to_recordset(items)
           AS x(i integer, run bigint, status text, started timestamptz,
                finished timestamptz, count bigint, extra jsonb, cause text,
                message text, v integer, next timestamptz, category text,
                retryable boolean, jitter double precision, cursor jsonb, findings jsonb)
      LEFT JOIN unnest(f_id, f_job) AS r(id, job_id) ON r.id = x.run;
    IF n_items = 0 THEN
        RETURN;
    END IF;

    -- As in _claim_many: optimistically all at once, item by item only if one fails.
    BEGIN
        IF n_items = 1 OR n_jobs + n_orphans < n_items OR n_found > 0 THEN
            -- One result (the set-based statements' fixed cost is not worth it), two
            -- results of one job (the second sees what the first saved), or findings to
            -- record: item by item, as before.
            RETURN QUERY SELECT * FROM coordinator._settle_each(p_items::json, false);
            RETURN;
        END IF;

        -- The jobs' row locks, in job id order, read as locked (a job gone meanwhile: its
        -- item is 'gone', and its runs went with it).
        SELECT array_agg(s.id), array_agg(s.paused), array_agg(s.invalid),
               array_agg(s.schedule_version), array_agg(s.next_run_at),
               array_agg(s.retries), array_agg(s.retry_backoff),
               array_agg(s.retry_max_delay), array_agg(s.recoverable)
          INTO j_id, j_paused, j_invalid, j_version, j_next, j_retries, j_backoff,
               j_maxdelay, j_recover
          FROM (SELECT j.id, j.paused, j.invalid_reason IS NOT NULL AS invalid,
                       j.schedule_version, j.next_run_at, j.retries, j.retry_backoff,
                       j.retry_max_delay, j.recoverable
                  FROM coordinator.jobs j WHERE j.id = ANY (a_job) ORDER BY j.id
                   FOR NO KEY UPDATE OF j) s;

        -- The results, saved if the run still waits for one (else 'already').
        WITH u AS (
            UPDATE coordinator.runs
               -- (Each run's item found once, not once per column.)
               SET (status, started_at, finished_at, paused_at, count, extra, error_cause,
                    error_message, progress, category, retryable, cursor,
                    last_progress_at) = (
                   SELECT a_status[x.k],
                          -- A resumed run keeps its first start.
                          CASE WHEN runs.resumes > 0 THEN runs.started_at
                               ELSE coalesce(a_started[x.k], runs.started_at) END,
                          -- A paused run is not finished: it has paused_at instead.
                          CASE WHEN a_status[x.k] = 'paused' THEN NULL
                               ELSE a_finished[x.k] END,
                          CASE WHEN a_status[x.k] = 'paused' THEN a_finished[x.k] END,
                          a_count[x.k],
                          a_extra[x.k],
                          a_cause[x.k],
                          a_message[x.k],
                          -- A worker's last progress snapshot is saved with the result.
                          coalesce(a_extra[x.k] -> 'progress', runs.progress),
                          CASE WHEN a_status[x.k] NOT IN ('succeeded', 'paused')
                               THEN coalesce(a_category[x.k],
                                             coordinator._category(a_status[x.k],
                                                                   a_cause[x.k]))
                          END,
                          CASE WHEN a_status[x.k] NOT IN ('succeeded', 'paused')
                               THEN a_retryable[x.k] END,
                          coalesce(a_cursor[x.k] -> 'v', runs.cursor),
                          CASE WHEN a_cursor[x.k] -> 'v' IS NULL THEN runs.last_progress_at
                               ELSE a_finished[x.k] END
                     -- (OFFSET 0: not pulled up, so found once, not once per use.)
                     FROM (SELECT array_position(a_run, runs.id) AS k OFFSET 0) x)
             WHERE runs.id = ANY (a_run) AND runs.status = ANY (settleable)
            RETURNING runs.id, runs.job_id, runs.status, runs.trigger, runs.scheduled_for,
                      runs.attempt, runs.category, runs.args, runs.cursor, runs.count
        )
        SELECT array_agg(u.id), array_agg(u.job_id), array_agg(u.status),
               array_agg(u.trigger), array_agg(u.scheduled_for), array_agg(u.attempt),
               array_agg(u.category), array_agg(u.args), array_agg(u.cursor),
               array_agg(u.count)
          INTO s_id, s_job, s_status, s_trigger, s_sched, s_attempt, s_category, s_args,
               s_cursor, s_count
          FROM u;

        -- What the saved results ask for, by the job's policy as locked: a retry, the mark
        -- of the last attempt, or the next deadline (if the run consumed the saved deadline
        -- and the schedule was not edited meanwhile).
        IF s_id IS NOT NULL THEN
            SELECT array_agg(d.id) FILTER (WHERE d.retry AND d.left),
                   array_agg(d.id) FILTER (WHERE d.retry AND NOT d.left),
                   array_agg(d.id ORDER BY d.job) FILTER (WHERE d.moves),
                   array_agg(d.job ORDER BY d.job) FILTER (WHERE d.moves),
                   array_agg(d.next ORDER BY d.job) FILTER (WHERE d.moves)
              INTO to_retry, spent, mv_run, mv_job, mv_next
              FROM (
                SELECT s.id, s.job AS job, x.next,
                       s.status IN ('failed', 'timed_out') AND j.retries > 0
                       AND coalesce(x.retryable, s.category IS DISTINCT FROM 'invalid-input')
                       AS retry,
                       s.attempt <= j.retries AS left,
                       j.version = x.v
                       AND (s.trigger = 'schedule'
                            OR (s.sched IS NOT NULL AND j.next = s.sched)
                            OR j.next <= x.finished) AS moves
                  FROM unnest(s_id, s_job, s_status, s_trigger, s_sched, s_attempt,
                              s_category)
                       AS s(id, job, status, trigger, sched, attempt, category)
                  JOIN unnest(j_id, j_retries, j_version, j_next)
                       AS j(id, retries, version, next) ON j.id = s.job
                  JOIN unnest(a_run, a_v, a_next, a_finished, a_retryable)
                       AS x(run, v, next, finished, retryable) ON x.run = s.id
              ) d;
        END IF;

        -- A failure the job's policy retries: a new run, due after the backoff (less the
        -- jitter); a recoverable job's retry goes on from the failed run's cursor and
        -- counter.
        IF to_retry IS NOT NULL THEN
            WITH n AS (
                INSERT INTO coordinator.runs AS n (job_id, trigger, status, args, attempt,
                                                   scheduled_for, due_at, retry_of, cursor,
                                                   count)
                SELECT j.id, 'retry', 'queued', r.args, r.attempt + 1, r.sched,
                       x.finished + make_interval(secs => (
                           least(extract(epoch FROM j.backoff)::double precision
                                 * power(2::double precision, least(r.attempt - 1, 60)),
                                 extract(epoch FROM j.maxdelay)::double precision)
                           * (1 - 0.25 * least(greatest(coalesce(x.jitter, 0), 0), 1)))),
                       r.id,
                       CASE WHEN j.recover THEN r.cursor END,
                       CASE WHEN j.recover THEN r.count END
                  FROM unnest(s_id, s_job, s_args, s_attempt, s_sched, s_cursor, s_count)
                       AS r(id, job, args, attempt, sched, cursor, count)
                  JOIN unnest(j_id, j_backoff, j_maxdelay, j_recover)
                       AS j(id, backoff, maxdelay, recover) ON j.id = r.job
                  JOIN unnest(a_run, a_finished, a_jitter) AS x(run, finished, jitter)
                    ON x.run = r.id
                 WHERE r.id = ANY (to_retry)
                 ORDER BY r.job
                ON CONFLICT (job_id)
                   WHERE status IN ('queued', 'pending', 'running', 'unresolved',
                                    'cancel_requested', 'paused')
                DO NOTHING
                RETURNING n.retry_of, n.id, n.due_at
            )
            SELECT array_agg(n.retry_of), array_agg(n.id), array_agg(n.due_at)
              INTO q_of, q_id, q_due
              FROM n;
        END IF;

        -- The last attempt the job allowed: marked, and the deadline moves on.
        IF spent IS NOT NULL THEN
            UPDATE coordinator.runs SET exhausted = true WHERE runs.id = ANY (spent);
        END IF;

        -- The next deadline, saved with the result (not where a retry was queued instead).
        IF mv_job IS NOT NULL AND q_of IS NOT NULL THEN
            SELECT array_agg(m.job), array_agg(m.next) INTO mv_job, mv_next
              FROM unnest(mv_run, mv_job, mv_next) AS m(run, job, next)
             WHERE NOT (m.run = ANY (q_of));
        END IF;
        IF mv_job IS NOT NULL THEN
            WITH m AS (
                UPDATE coordinator.jobs
                   SET next_run_at = mv_next[array_position(mv_job, jobs.id)],
                       updated_at = now()
                 WHERE jobs.id = ANY (mv_job)
                RETURNING jobs.id, jobs.paused, jobs.invalid_reason IS NOT NULL AS invalid,
                          jobs.schedule_version, jobs.next_run_at
            )
            SELECT array_agg(m.id), array_agg(m.paused), array_agg(m.invalid),
                   array_agg(m.schedule_version), array_agg(m.next_run_at)
              INTO m_id, m_paused, m_invalid, m_version, m_next
              FROM m;
        END IF;

        RETURN QUERY
        SELECT x.i, NULL::text, NULL::text,
               CASE WHEN j.id IS NULL THEN 'gone'
                    WHEN s.id IS NULL THEN 'already' ELSE 'saved' END,
               j.id,
               CASE WHEN m.id IS NULL THEN j.paused ELSE m.paused END,
               CASE WHEN m.id IS NOT NULL THEN m.invalid
                    WHEN j.id IS NOT NULL THEN j.invalid END,
               CASE WHEN m.id IS NULL THEN j.version ELSE m.version END,
               CASE WHEN m.id IS NULL THEN j.next ELSE m.next END,
               CASE WHEN s.id IS NULL THEN w.id ELSE q.id END,
               CASE WHEN s.id IS NULL THEN w.due_at ELSE q.due END,
               coalesce(s.id = ANY (spent), false),
               s.category
          FROM unnest(a_i, a_run, a_job) AS x(i, run, job)
          LEFT JOIN unnest(j_id, j_paused, j_invalid, j_version, j_next)
                    AS j(id, paused, invalid, version, next) ON j.id = x.job
          LEFT JOIN unnest(m_id, m_paused, m_invalid, m_version, m_next)
                    AS m(id, paused, invalid, version, next) ON m.id = x.job
          LEFT JOIN unnest(s_id, s_category) AS s(id, category) ON s.id = x.run
          LEFT JOIN unnest(q_of, q_id, q_due) AS q(of, id, due) ON q.of = x.run
          -- Saved before: the retry it queued then, if it still waits, is armed again.
          LEFT JOIN LATERAL (
              SELECT w.id, w.due_at FROM coordinator.runs w
               WHERE j.id IS NOT NULL AND s.id IS NULL
                 AND w.retry_of = x.run AND w.status = ANY (waiting)
               LIMIT 1
          ) w ON true
         -- (The order of 0015: by job, then item; items without a job last.)
         ORDER BY x.job, x.i;
    EXCEPTION WHEN others THEN
        RETURN QUERY SELECT * FROM coordinator._settle_each(p_items::json, true);
    END;
END
$$;
