-- Claims and settlements in batches: one statement for many runs, each handled exactly
-- as one coordinator._claim / coordinator._settle call would handle it alone.
--
-- Under load the daemon groups the runs that become admissible while a claim statement
-- is in flight, and the results that arrive while a settlement is in flight, into the
-- next statement (like a database's group commit); an idle daemon still sends a single
-- trigger's claim at once, as a batch of one. Each item runs in a subtransaction of its
-- own when one fails (a BEGIN ... EXCEPTION block), so an item PostgreSQL refuses -- a
-- trigger raising for one job, a check violation -- rolls back only itself: it comes
-- back with its SQLSTATE and message, and the others are claimed or saved. Items are taken in job id
-- order, so two batches (or a batch and an application locking several jobs in that
-- order) do not deadlock over each other's row locks.
--
-- Items arrive as one JSON text parameter (an array parameter of a composite type would
-- make asyncpg introspect the type: extra statements on first use).
--
-- Each claim item carries the daemon's clock ("now") and the deadline to save should the
-- deadline misfire ("skip"), and returns the job's retry and misfire policies with the
-- rest of its definition; each settlement item carries the category, what the call said
-- about retrying and the jitter, and returns the retry it queued (retry_run_id,
-- retry_due_at), exhausted and the category saved (0007, attempts and retries).

CREATE FUNCTION coordinator._claim_many(
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
    misfire_grace    interval
)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    items json := p_items::json;
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
                            NULL::interval
                       FROM json_to_recordset(items) AS x(i integer);
        RETURN;
    END IF;
    -- Optimistically, the whole batch in one go; if any item fails, the batch is rolled
    -- back to here and done again item by item, each in a subtransaction of its own
    -- (a subtransaction per item costs more than the batch: only pay it when needed).
    BEGIN
        RETURN QUERY SELECT * FROM coordinator._claim_each(items, p_instance, p_workers, false);
    EXCEPTION WHEN others THEN
        RETURN QUERY SELECT * FROM coordinator._claim_each(items, p_instance, p_workers, true);
    END;
END
$$;

-- The loop of _claim_many: each item as coordinator._claim handles it (fencing done
-- by the caller); with p_isolate, each item in a subtransaction so that an item that
-- fails comes back with its error and the others are claimed.
CREATE FUNCTION coordinator._claim_each(
    p_items     json,
    p_instance  text,
    p_workers   text[],
    p_isolate   boolean
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
    misfire_grace    interval
)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    item record;
    c    record;
BEGIN
    FOR item IN
        SELECT * FROM json_to_recordset(p_items)
                   AS x(i integer, job bigint, run bigint, at timestamptz, v integer,
                        now timestamptz, skip timestamptz)
         ORDER BY x.job, x.i
    LOOP
        i := item.i;
        err_state := NULL;
        err_message := NULL;
        IF p_isolate THEN
            BEGIN
                SELECT * INTO c FROM coordinator._claim(item.job, item.run, item.at, item.v,
                                                        p_instance, p_workers, NULL, 0, 0,
                                                        item.now, item.skip);
            EXCEPTION WHEN others THEN
                err_state := SQLSTATE;
                err_message := SQLERRM;
                reason := NULL; run_id := NULL;
                RETURN NEXT;
                CONTINUE;
            END;
        ELSE
            SELECT * INTO c FROM coordinator._claim(item.job, item.run, item.at, item.v,
                                                    p_instance, p_workers, NULL, 0, 0,
                                                    item.now, item.skip);
        END IF;
        reason := c.reason; run_id := c.run_id; trigger := c.trigger; args := c.args;
        attempt := c.attempt; scheduled_for := c.scheduled_for;
        claimed_at := c.claimed_at; namespace := c.namespace; name := c.name;
        schedule_kind := c.schedule_kind; schedule := c.schedule;
        timezone := c.timezone; target := c.target; params := c.params;
        timeout := c.timeout; priority := c.priority; idempotent := c.idempotent;
        schedule_version := c.schedule_version; next_run_at := c.next_run_at;
        retries := c.retries; retry_backoff := c.retry_backoff;
        retry_max_delay := c.retry_max_delay; misfire := c.misfire;
        misfire_grace := c.misfire_grace;
        RETURN NEXT;
    END LOOP;
END
$$;

CREATE FUNCTION coordinator._settle_many(
    p_items text  -- [{"i", "run", "status", "started", "finished", "count", "extra",
                  --   "cause", "message", "v", "next", "category", "retryable", "jitter"}]
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
DECLARE
    items json := p_items::json;
BEGIN
    -- As in _claim_many: optimistically all at once, item by item only if one fails.
    BEGIN
        RETURN QUERY SELECT * FROM coordinator._settle_each(items, false);
    EXCEPTION WHEN others THEN
        RETURN QUERY SELECT * FROM coordinator._settle_each(items, true);
    END;
END
$$;

CREATE FUNCTION coordinator._settle_each(p_items json, p_isolate boolean) RETURNS TABLE (
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
DECLARE
    item record;
    s    record;
BEGIN
    FOR item IN
        SELECT x.*, r.job_id AS job
          FROM json_to_recordset(p_items)
               AS x(i integer, run bigint, status text, started timestamptz,
                    finished timestamptz, count bigint, extra jsonb, cause text,
                    message text, v integer, next timestamptz, category text,
                    retryable boolean, jitter double precision)
          LEFT JOIN coordinator.runs r ON r.id = x.run
         ORDER BY r.job_id, x.i
    LOOP
        i := item.i;
        err_state := NULL;
        err_message := NULL;
        IF p_isolate THEN
            BEGIN
                SELECT * INTO s FROM coordinator._settle(item.run, item.status, item.started,
                                                         item.finished, item.count, item.extra,
                                                         item.cause, item.message, item.v,
                                                         item.next, item.category,
                                                         item.retryable, item.jitter);
            EXCEPTION WHEN others THEN
                err_state := SQLSTATE;
                err_message := SQLERRM;
                outcome := NULL;
                RETURN NEXT;
                CONTINUE;
            END;
        ELSE
            SELECT * INTO s FROM coordinator._settle(item.run, item.status, item.started,
                                                     item.finished, item.count, item.extra,
                                                     item.cause, item.message, item.v,
                                                     item.next, item.category,
                                                     item.retryable, item.jitter);
        END IF;
        outcome := s.outcome; job_id := s.job_id; paused := s.paused;
        invalid := s.invalid; schedule_version := s.schedule_version;
        next_run_at := s.next_run_at;
        retry_run_id := s.retry_run_id; retry_due_at := s.retry_due_at;
        exhausted := s.exhausted; category := s.category;
        RETURN NEXT;
    END LOOP;
END
$$;
