-- A call a stop abandons (its stop timeout passed), of an idempotent job, is queued
-- again, once, as the crash sweep queues a lost one (0012's _sweep_lost): a deploy's
-- restart left such a run `cancelled` and its work undone, where a kill -9 would have
-- had it run again (a tester's finding, 2026-12-02). The run keeps its `cancelled` (the
-- daemon did cancel it); its retry is a new run, `retry_of` it. Not for a retry (as the
-- sweep), a recoverable job's run (it pauses instead) or a removed job; nor when the
-- job has another run outstanding meanwhile (one per job).

CREATE FUNCTION coordinator._requeue_abandoned(p_runs bigint[])
RETURNS TABLE (run_id bigint, retry_id bigint)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    rid bigint;
    jid bigint;
    r   coordinator.runs;
    j   coordinator.jobs;
    n   bigint;
BEGIN
    FOREACH rid IN ARRAY coalesce(p_runs, '{}') LOOP
        SELECT x.job_id INTO jid FROM coordinator.runs x WHERE x.id = rid;
        CONTINUE WHEN jid IS NULL;
        -- The job's row before the run's (the lock order of 0016).
        SELECT * INTO j FROM coordinator.jobs WHERE id = jid FOR NO KEY UPDATE;
        SELECT * INTO r FROM coordinator.runs WHERE id = rid FOR UPDATE;
        CONTINUE WHEN r.id IS NULL OR j.id IS NULL OR r.job_id <> j.id;
        CONTINUE WHEN r.status <> 'cancelled' OR r.error_message <> 'cancelled: daemon stopping'
                      OR r.trigger = 'retry' OR NOT j.idempotent OR j.recoverable
                      OR j.removed_at IS NOT NULL;
        CONTINUE WHEN EXISTS (
            SELECT 1 FROM coordinator.runs o
             WHERE o.job_id = j.id
               AND o.status IN ('queued', 'pending', 'running', 'unresolved',
                                'cancel_requested', 'paused'));
        INSERT INTO coordinator.runs (job_id, trigger, status, args, attempt, scheduled_for,
                                      retry_of)
        VALUES (j.id, 'retry', 'queued', r.args, r.attempt + 1, r.scheduled_for, r.id)
        RETURNING id INTO n;
        UPDATE coordinator.runs
           SET error_message = format('%s; queued again as run %s (the job is idempotent)',
                                      r.error_message, n)
         WHERE id = r.id;
        run_id := r.id;
        retry_id := n;
        RETURN NEXT;
    END LOOP;
END
$$;
REVOKE EXECUTE ON FUNCTION coordinator._requeue_abandoned(bigint[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION coordinator._requeue_abandoned(bigint[]) TO coordinator_daemon;
