-- A call a stop abandons (its stop timeout passed), of an idempotent job, is queued
-- again, once, as the crash sweep queues a lost one (0012's _sweep_lost): a deploy's
-- restart left such a run `cancelled` and its work undone, where a kill -9 would have
-- had it run again (a tester's finding, 2026-12-02). The run keeps its `cancelled` (the
-- daemon did cancel it); its retry is a new run, `retry_of` it. Not for a retry (as the
-- sweep), a recoverable job's run (it pauses instead) or a removed job; nor when the
-- job has another run outstanding meanwhile (one per job).
--
-- Fenced as a claim is (0018, 0020): only while the caller's lock session still leads.
-- A daemon that lost its lead must not queue anything: a standby leading meanwhile would
-- not hear of it (the daemon's own inserts send no wake), and a manual job's run queued
-- unseen would answer every trigger() of that job until a restart.

CREATE FUNCTION coordinator._requeue_abandoned(
    p_runs       bigint[],
    p_leader_pid integer,
    p_lock_class integer,
    p_lock_obj   integer
)
RETURNS TABLE (run_id bigint, retry_id bigint)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    rid bigint;
    r   coordinator.runs;
    j   coordinator.jobs;
    n   bigint;
BEGIN
    IF p_leader_pid IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock_shared(p_lock_class, p_lock_obj + 1);
        IF NOT EXISTS (
            SELECT 1 FROM pg_locks l
             WHERE l.locktype = 'advisory' AND l.pid = p_leader_pid AND l.granted
               AND l.classid = p_lock_class::oid AND l.objid = p_lock_obj::oid
               AND l.objsubid = 2)
        THEN
            RETURN;
        END IF;
    END IF;
    -- In job id order, as the batches lock jobs (0021): no deadlock with one in flight.
    FOR rid IN SELECT x.id FROM coordinator.runs x
                WHERE x.id = ANY (coalesce(p_runs, '{}')) ORDER BY x.job_id, x.id
    LOOP
        -- The job's row before the run's (the lock order of 0016).
        SELECT jj.* INTO j FROM coordinator.jobs jj
         WHERE jj.id = (SELECT x.job_id FROM coordinator.runs x WHERE x.id = rid)
           FOR NO KEY UPDATE;
        SELECT rr.* INTO r FROM coordinator.runs rr WHERE rr.id = rid FOR UPDATE;
        CONTINUE WHEN r.id IS NULL OR j.id IS NULL OR r.job_id <> j.id;
        CONTINUE WHEN r.status <> 'cancelled' OR r.error_message <> 'cancelled: daemon stopping'
                      OR r.trigger = 'retry' OR NOT j.idempotent OR j.recoverable
                      OR j.removed_at IS NOT NULL;
        -- One outstanding run per job: a trigger() meanwhile (it does not lock the job)
        -- wins, and this one is not queued (ON CONFLICT waits for it, then skips).
        INSERT INTO coordinator.runs (job_id, trigger, status, args, attempt, scheduled_for,
                                      retry_of)
        VALUES (j.id, 'retry', 'queued', r.args, r.attempt + 1, r.scheduled_for, r.id)
        ON CONFLICT (job_id)
           WHERE status IN ('queued', 'pending', 'running', 'unresolved', 'cancel_requested',
                            'paused')
        DO NOTHING
        RETURNING id INTO n;
        CONTINUE WHEN n IS NULL;
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
REVOKE EXECUTE ON FUNCTION coordinator._requeue_abandoned(bigint[], integer, integer, integer)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION coordinator._requeue_abandoned(bigint[], integer, integer, integer)
    TO coordinator_daemon;
