-- Faster batches (issue #14): a batch of claims or settlements in a few set-based
-- statements instead of a few statements per item.
--
-- Measured (perf on the backend, a 5,000-run burst of claims and settlements in batches
-- of 30): about 60% of PostgreSQL's time went to starting and ending statements, not to
-- the rows -- every UPDATE or INSERT of a run re-reads the table's CHECK constraints and
-- trigger WHEN clauses from their stored form, plans them and builds its executor state;
-- the function call per item (with its SET clause) and the copy of thirty OUT columns came
-- on top. Row work (the heap, five indexes) was under 10%. So the batch functions now do
-- their work once per batch: lock the jobs (in id order, as before), lock the queued runs,
-- decide every item's outcome in one SELECT, then one statement per kind of write (promote
-- queued runs, resume paused runs, insert new runs; save results, queue retries, mark
-- exhausted runs, save next deadlines), each skipped when no item needs it.
--
-- Every rule is the one of coordinator._claim and coordinator._settle (0012), item by item:
-- the same refusals in the same order of precedence, the same row locks, the same
-- ON CONFLICT on the one-outstanding-run index, the same fencing (once per batch, as in
-- 0010), the same concurrent-edit check before a next deadline is saved with its result.
-- Items of one batch can meet only through their job, so the set-based path is taken
-- only when every item names a different job (and, for settlements, none carries
-- findings, which have their own bookkeeping); any other batch goes item by item exactly
-- as before (coordinator._claim_each / _settle_each, unchanged). If anything fails, the
-- batch is rolled back and done again item by item, each item in a subtransaction of its
-- own, as in 0010: one refused item fails alone.
--
-- Redefined here (same arguments and result columns, so grants and callers are kept):
-- _claim_many and _settle_many, each from its latest definition (0012 and 0010).
-- Every function runs with enable_seqscan = off (0004).

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
LANGUAGE plpgsql SET enable_seqscan = off AS $$
-- (OUT columns share names with table columns: in SQL here names mean the columns.)
#variable_conflict use_column
DECLARE
    items   json := p_items::json;
    -- The items, one array per field, in job id order (the order rows are locked in).
    a_i     integer[];
    a_job   bigint[];
    a_run   bigint[];
    a_at    timestamptz[];
    a_v     integer[];
    a_now   timestamptz[];
    a_skip  timestamptz[];
    a_why   text[];     -- the refusal (NULL: granted)
    a_held  boolean[];  -- the job has a paused run (a granted deadline resumes it)
    claimed coordinator.runs[] := '{}';
    more    coordinator.runs[];
    n_items integer;
    n_jobs  integer;
    any_promoted boolean;  -- some granted item promotes a queued run
    any_resumed  boolean;  -- some granted deadline resumes a paused run
    any_new      boolean;  -- some granted deadline inserts a run
BEGIN
    -- Fencing once for the batch (each item would otherwise scan pg_locks again).
    IF p_leader_pid IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM pg_locks l
         WHERE l.locktype = 'advisory' AND l.pid = p_leader_pid AND l.granted
           AND l.classid = p_lock_class::oid AND l.objid = p_lock_obj::oid AND l.objsubid = 2
    ) THEN
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

    SELECT array_agg(x.i ORDER BY x.job, x.i), array_agg(x.job ORDER BY x.job, x.i),
           array_agg(x.run ORDER BY x.job, x.i), array_agg(x.at ORDER BY x.job, x.i),
           array_agg(x.v ORDER BY x.job, x.i), array_agg(x.now ORDER BY x.job, x.i),
           array_agg(x.skip ORDER BY x.job, x.i), count(*), count(DISTINCT x.job)
      INTO a_i, a_job, a_run, a_at, a_v, a_now, a_skip, n_items, n_jobs
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
        IF n_jobs < n_items THEN
            -- Two items of one job: the second sees what the first did. Item by item.
            RETURN QUERY SELECT * FROM coordinator._claim_each(items, p_instance, p_workers,
                                                               false);
            RETURN;
        END IF;

        -- The jobs' row locks, in job id order; then the queued runs' (each only if it is
        -- its item's job's, as _claim locks it).
        PERFORM 1 FROM coordinator.jobs j WHERE j.id = ANY (a_job) ORDER BY j.id
            FOR NO KEY UPDATE;
        IF cardinality(array_remove(a_run, NULL)) > 0 THEN
            PERFORM 1 FROM unnest(a_job, a_run) AS x(job, run)
                      JOIN coordinator.runs r
                        ON r.id = x.run AND r.job_id = x.job AND r.id = ANY (a_run)
             ORDER BY x.job FOR UPDATE OF r;
        END IF;

        -- Each item's outcome, as _claim decides it, from the rows as they are now locked.
        SELECT array_agg(d.why ORDER BY d.o), array_agg(d.held ORDER BY d.o),
               coalesce(bool_or(d.why IS NULL AND d.run IS NOT NULL), false),
               coalesce(bool_or(d.why IS NULL AND d.held), false),
               coalesce(bool_or(d.why IS NULL AND d.run IS NULL AND NOT d.held), false)
          INTO a_why, a_held, any_promoted, any_resumed, any_new
          FROM (
            SELECT x.o, x.run,
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
                   x.run IS NULL AND EXISTS (
                       SELECT 1 FROM coordinator.runs p
                        WHERE p.job_id = x.job AND p.status = 'paused') AS held
              FROM unnest(a_job, a_run, a_at, a_v, a_now) WITH ORDINALITY
                   AS x(job, run, at, v, now, o)
              LEFT JOIN coordinator.jobs j ON j.id = x.job AND j.id = ANY (a_job)
              LEFT JOIN coordinator.runs r
                ON r.id = x.run AND r.job_id = x.job AND r.id = ANY (a_run)
          ) d;

        -- A misfired deadline: the one after the daemon's clock is saved in its place.
        IF 'misfire' = ANY (a_why) THEN
            UPDATE coordinator.jobs j SET next_run_at = x.skip, updated_at = now()
              FROM unnest(a_job, a_skip, a_why) AS x(job, skip, why)
             WHERE x.why = 'misfire' AND j.id = x.job AND j.id = ANY (a_job);
        END IF;

        -- Queued manual and retry runs: promoted. (A queued run that started before is a
        -- resume, a trigger of a paused run: it keeps its first start.)
        IF any_promoted THEN
            WITH u AS (
                UPDATE coordinator.runs
                   SET status = 'running', claimed_at = now(),
                       started_at = coalesce(runs.started_at, now()),
                       instance = p_instance, schedule_version = j.schedule_version,
                       resumes = runs.resumes + CASE WHEN runs.started_at IS NULL THEN 0 ELSE 1 END,
                       paused_at = NULL, error_cause = NULL, error_message = NULL
                  FROM unnest(a_job, a_run, a_why) AS x(job, run, why)
                  JOIN coordinator.jobs j ON j.id = x.job AND j.id = ANY (a_job)
                 WHERE x.why IS NULL AND x.run IS NOT NULL AND runs.id = x.run
                   AND runs.id = ANY (a_run)
                RETURNING runs
            )
            SELECT coalesce(array_agg(u.runs), '{}') INTO more FROM u;
            claimed := claimed || more;
        END IF;

        -- Deadlines of jobs whose run is paused: the tick resumes it; it serves this
        -- deadline now.
        IF any_resumed THEN
            WITH u AS (
                UPDATE coordinator.runs
                   SET status = 'running', claimed_at = now(), instance = p_instance,
                       schedule_version = j.schedule_version, scheduled_for = x.at,
                       resumes = runs.resumes + 1, paused_at = NULL, error_cause = NULL,
                       error_message = NULL
                  FROM unnest(a_job, a_at, a_why, a_held) AS x(job, at, why, held)
                  JOIN coordinator.jobs j ON j.id = x.job AND j.id = ANY (a_job)
                 WHERE x.why IS NULL AND x.held AND runs.job_id = x.job
                   AND runs.job_id = ANY (a_job)
                   AND runs.status = 'paused'
                RETURNING runs
            )
            SELECT coalesce(array_agg(u.runs), '{}') INTO more FROM u;
            claimed := claimed || more;
        END IF;

        -- Other deadlines: a new run, unless one is outstanding (the partial unique index
        -- decides, whatever races).
        IF any_new THEN
            WITH u AS (
                INSERT INTO coordinator.runs AS n (job_id, trigger, status, scheduled_for,
                                                   claimed_at, started_at, schedule_version,
                                                   instance)
                SELECT x.job, 'schedule', 'running', x.at, now(), now(), j.schedule_version,
                       p_instance
                  FROM unnest(a_job, a_run, a_at, a_why, a_held)
                       AS x(job, run, at, why, held)
                  JOIN coordinator.jobs j ON j.id = x.job AND j.id = ANY (a_job)
                 WHERE x.why IS NULL AND x.run IS NULL AND NOT x.held
                 ORDER BY x.job
                ON CONFLICT (job_id)
                   WHERE status IN ('queued', 'pending', 'running', 'unresolved',
                                    'cancel_requested', 'paused')
                DO NOTHING
                RETURNING n
            )
            SELECT coalesce(array_agg(u.n), '{}') INTO more FROM u;
            claimed := claimed || more;
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
          FROM unnest(a_i, a_job, a_at, a_skip, a_why) WITH ORDINALITY
               AS x(i, job, at, skip, why, o)
          LEFT JOIN unnest(claimed) AS c ON c.job_id = x.job
          LEFT JOIN coordinator.jobs j ON j.id = x.job AND j.id = ANY (a_job)
         ORDER BY x.o;
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
LANGUAGE plpgsql SET enable_seqscan = off AS $$
-- (OUT columns share names with table columns: in SQL here names mean the columns.)
#variable_conflict use_column
DECLARE
    items     json := p_items::json;
    a_job     bigint[];    -- each item's run's job (NULL: no such run), in job id order
    a_run     bigint[];    -- each item's run, in the same order
    n_items   integer;
    n_jobs    integer;     -- distinct jobs among the items that have one
    n_orphans integer;     -- items whose run does not exist
    n_found   integer;     -- items that carry findings
    saved     coordinator.runs[];
    to_retry  bigint[];    -- saved runs whose job's policy asks for a retry ...
    spent     bigint[];    -- ... and those that used the job's last attempt
    moving    bigint[];    -- saved runs that may move their job's deadline
    q_of      bigint[];    -- retries queued now: of which run, id, due time
    q_id      bigint[];
    q_due     timestamptz[];
BEGIN
    -- (Each run looked up by its key: a join could read the whole table.)
    SELECT array_agg(x.job ORDER BY x.job, x.i), array_agg(x.run ORDER BY x.job, x.i),
           count(*), count(DISTINCT x.job), count(*) FILTER (WHERE x.job IS NULL),
           count(*) FILTER (WHERE x.findings IS NOT NULL)
      INTO a_job, a_run, n_items, n_jobs, n_orphans, n_found
      FROM (SELECT x.i, x.run, x.findings,
                   (SELECT r.job_id FROM coordinator.runs r WHERE r.id = x.run) AS job
              FROM json_to_recordset(items) AS x(i integer, run bigint, findings jsonb)) x;
    IF n_items = 0 THEN
        RETURN;
    END IF;

    -- As in _claim_many: optimistically all at once, item by item only if one fails.
    BEGIN
        IF n_jobs + n_orphans < n_items OR n_found > 0 THEN
            -- Two results of one job (the second sees what the first saved), or findings
            -- to record: item by item.
            RETURN QUERY SELECT * FROM coordinator._settle_each(items, false);
            RETURN;
        END IF;

        -- The jobs' row locks, in job id order (a job gone meanwhile: its item is 'gone').
        PERFORM 1 FROM coordinator.jobs j WHERE j.id = ANY (a_job) ORDER BY j.id
            FOR NO KEY UPDATE;

        -- The results, saved if the run still waits for one (else 'already'); with what
        -- decides the rest, read from the rows as saved.
        WITH x AS (
            SELECT x.*, r.job_id AS job
              FROM json_to_recordset(items)
                   AS x(i integer, run bigint, status text, started timestamptz,
                        finished timestamptz, count bigint, extra jsonb, cause text,
                        message text, v integer, next timestamptz, category text,
                        retryable boolean, jitter double precision, cursor jsonb)
              JOIN coordinator.runs r ON r.id = x.run AND r.id = ANY (a_run)
        ), u AS (
            UPDATE coordinator.runs
               SET status = x.status,
                   -- A resumed run keeps its first start.
                   started_at = CASE WHEN runs.resumes > 0 THEN runs.started_at
                                     ELSE coalesce(x.started, runs.started_at) END,
                   -- A paused run is not finished: it has paused_at instead.
                   finished_at = CASE WHEN x.status = 'paused' THEN NULL ELSE x.finished END,
                   paused_at = CASE WHEN x.status = 'paused' THEN x.finished END,
                   count = x.count, extra = x.extra,
                   error_cause = x.cause, error_message = x.message,
                   -- A worker's last progress snapshot is saved with the result.
                   progress = coalesce(x.extra->'progress', runs.progress),
                   category = CASE WHEN x.status NOT IN ('succeeded', 'paused')
                                   THEN coalesce(x.category,
                                                 coordinator._category(x.status, x.cause)) END,
                   retryable = CASE WHEN x.status NOT IN ('succeeded', 'paused')
                                    THEN x.retryable END,
                   cursor = coalesce(x.cursor -> 'v', runs.cursor),
                   last_progress_at = CASE WHEN x.cursor -> 'v' IS NULL
                                           THEN runs.last_progress_at ELSE x.finished END
              FROM x JOIN coordinator.jobs j ON j.id = x.job AND j.id = ANY (a_job)
             WHERE runs.id = x.run AND runs.id = ANY (a_run)
               AND runs.status IN ('running', 'pending', 'cancel_requested')
            RETURNING runs,
                      runs.status IN ('failed', 'timed_out') AND j.retries > 0
                      AND coalesce(x.retryable, runs.category IS DISTINCT FROM 'invalid-input')
                      AS retry,
                      runs.attempt <= j.retries AS left,
                      j.schedule_version = x.v
                      AND (runs.trigger = 'schedule'
                           OR (runs.scheduled_for IS NOT NULL
                               AND j.next_run_at = runs.scheduled_for)
                           OR j.next_run_at <= x.finished) AS moves
        )
        SELECT coalesce(array_agg(u.runs), '{}'),
               array_agg((u.runs).id) FILTER (WHERE u.retry AND u.left),
               array_agg((u.runs).id) FILTER (WHERE u.retry AND NOT u.left),
               array_agg((u.runs).id) FILTER (WHERE u.moves)
          INTO saved, to_retry, spent, moving
          FROM u;

        -- A failure the job's policy retries: a new run, due after the backoff (less the
        -- jitter); a recoverable job's retry goes on from the failed run's cursor and
        -- counter.
        IF to_retry IS NOT NULL THEN
            WITH n AS (
                INSERT INTO coordinator.runs AS n (job_id, trigger, status, args, attempt,
                                                   scheduled_for, due_at, retry_of, cursor,
                                                   count)
                SELECT j.id, 'retry', 'queued', r.args, r.attempt + 1, r.scheduled_for,
                       x.finished + make_interval(secs => (
                           least(extract(epoch FROM j.retry_backoff)::double precision
                                 * power(2::double precision, least(r.attempt - 1, 60)),
                                 extract(epoch FROM j.retry_max_delay)::double precision)
                           * (1 - 0.25 * least(greatest(coalesce(x.jitter, 0), 0), 1)))),
                       r.id,
                       CASE WHEN j.recoverable THEN r.cursor END,
                       CASE WHEN j.recoverable THEN r.count END
                  FROM unnest(saved) AS r
                  JOIN json_to_recordset(items)
                       AS x(run bigint, finished timestamptz, jitter double precision)
                    ON x.run = r.id
                  JOIN coordinator.jobs j ON j.id = r.job_id AND j.id = ANY (a_job)
                 WHERE r.id = ANY (to_retry)
                 ORDER BY r.job_id
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

        -- The next deadline, saved with the result if the run consumed the saved deadline
        -- and the schedule was not edited meanwhile (and no retry was queued instead).
        IF moving IS NOT NULL THEN
            UPDATE coordinator.jobs j SET next_run_at = x.next, updated_at = now()
              FROM unnest(saved) AS r
              JOIN json_to_recordset(items) AS x(run bigint, next timestamptz)
                ON x.run = r.id
             WHERE j.id = r.job_id AND j.id = ANY (a_job) AND r.id = ANY (moving)
               AND NOT (r.id = ANY (coalesce(q_of, '{}')));
        END IF;

        RETURN QUERY
        SELECT x.i, NULL::text, NULL::text,
               CASE WHEN j.id IS NULL THEN 'gone'
                    WHEN s.id IS NULL THEN 'already' ELSE 'saved' END,
               j.id, j.paused,
               CASE WHEN j.id IS NOT NULL THEN j.invalid_reason IS NOT NULL END,
               j.schedule_version, j.next_run_at,
               CASE WHEN s.id IS NULL THEN w.id ELSE q.id END,
               CASE WHEN s.id IS NULL THEN w.due_at ELSE q.due END,
               coalesce(s.id = ANY (spent), false),
               s.category
          FROM json_to_recordset(items) AS x(i integer, run bigint)
          LEFT JOIN coordinator.runs r ON r.id = x.run AND r.id = ANY (a_run)
          LEFT JOIN coordinator.jobs j ON j.id = r.job_id AND j.id = ANY (a_job)
          LEFT JOIN unnest(saved) AS s ON s.id = x.run
          LEFT JOIN unnest(q_of, q_id, q_due) AS q(of, id, due) ON q.of = x.run
          -- Saved before: the retry it queued then, if it still waits, is armed again.
          LEFT JOIN LATERAL (
              SELECT w.id, w.due_at FROM coordinator.runs w
               WHERE w.retry_of = x.run AND w.status = 'queued'
                 AND j.id IS NOT NULL AND s.id IS NULL
               LIMIT 1
          ) w ON true
         ORDER BY r.job_id, x.i;
    EXCEPTION WHEN others THEN
        RETURN QUERY SELECT * FROM coordinator._settle_each(items, true);
    END;
END
$$;
