-- Giving back a run that was never sent (issue #14, 2026-12-01).
--
-- A run the daemon claimed is `running` before any worker has it: it waits for a slot
-- (with claim_ahead, by design; with claims = slots, when a claim lands just after the
-- last worker of its type left). If it cannot be sent -- the last worker serving its type
-- left, the daemon lost its leadership since the claim, or the stop timeout passed before
-- a slot freed -- nothing of it ran. Until now the daemon failed it (`crashed`, "not
-- sent: ..."), which a job without retries kept as a failure of work that never started.
-- Now the daemon gives it back, as a settlement (the same hold, retry and spool as any
-- result; status 'queued' in the settlement's item):
--
--   * a run of the schedule (trigger 'schedule', never resumed): its row is removed. The
--     claim did not move the job's saved deadline, so that deadline stands and is served
--     again, by whichever daemon leads, once a worker serves the job's type;
--   * a manual run or a retry: `queued` again, as it was before the claim (no claim time,
--     no start, no instance), keeping its due time, arguments and attempt.
--
-- Only a run still `running` under the claim the daemon names is given back (one
-- cancelled or swept meanwhile, or claimed again since: 'already', as a settlement of a
-- run already settled; the same give-back sent again, its first answer lost: 'already',
-- with the run queued again or the deadline, to be armed). A job
-- removed with its history kept meanwhile: the run is `cancelled`, as remove (0013) ends
-- the runs it finds waiting. A run that was started before (resumes > 0: a recoverable
-- job's, or one that was recoverable when it paused) is never given back: the daemon
-- fails or pauses it instead, and this function refuses it (SQLSTATE 55000).
--
-- The daemon sends give-backs through _settle_each (one subtransaction per item: they are
-- rare), never through _settle_many's set-based path, which stays as 0021 left it.
--
-- New: _give_back. Redefined from 0012: _settle_each (same signature, so its grants stay;
-- an item may carry "jid" and "ca", the job the run was claimed for and when: a
-- give-back's).
-- Every function runs with enable_seqscan = off (0004).

CREATE FUNCTION coordinator._give_back(
    p_run_id             bigint,
    p_job_id             bigint,   -- the job it was claimed for (NULL: the run's)
    p_claimed_at         timestamptz,  -- the claim it undoes (NULL: whichever)
    OUT outcome          text,     -- 'saved' | 'already' | 'gone'
    OUT job_id           bigint,
    OUT paused           boolean,
    OUT invalid          boolean,
    OUT schedule_version integer,
    OUT next_run_at      timestamptz,
    OUT retry_run_id     bigint,   -- the run, queued again (a manual run or a retry)
    OUT retry_due_at     timestamptz,
    OUT exhausted        boolean,
    OUT category         text
)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
-- (OUT job_id and category share names with columns: in SQL here they mean the columns.)
#variable_conflict use_column
DECLARE
    j coordinator.jobs;
    r coordinator.runs;
BEGIN
    exhausted := false;
    -- The job's row lock first, then the run's: the order every settlement takes. By the
    -- job's id when the daemon names it: sent again (its first answer lost), a give-back
    -- whose run was removed still finds its job, and answers 'already' with its state.
    SELECT jobs.* INTO j FROM coordinator.jobs
     WHERE jobs.id = coalesce(p_job_id, (SELECT runs.job_id FROM coordinator.runs
                                          WHERE runs.id = p_run_id))
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        outcome := 'gone';
        RETURN;
    END IF;
    SELECT runs.* INTO r FROM coordinator.runs
     WHERE runs.id = p_run_id AND runs.job_id = j.id
       FOR UPDATE;
    IF NOT FOUND OR r.status <> 'running'
       OR (p_claimed_at IS NOT NULL AND r.claimed_at IS DISTINCT FROM p_claimed_at) THEN
        -- (Running under another claim: claimed again by a daemon that read it queued
        -- after a first try of this give-back, whose answer was lost. That claim stands.)
        outcome := 'already';
        IF r.status = 'queued' AND r.claimed_at IS NULL THEN
            -- Given back before (this is the same give-back sent again): armed again.
            retry_run_id := r.id;
            retry_due_at := r.due_at;
        END IF;
    ELSIF r.resumes > 0 THEN
        RAISE EXCEPTION 'run % was started before (resumed % times): it cannot be given back',
                        p_run_id, r.resumes
              USING ERRCODE = '55000';
    ELSIF j.removed_at IS NOT NULL THEN
        -- Removed with its history kept while the run was claimed: ended as remove ends
        -- the runs it finds waiting (0013), never queued again on a hidden job.
        UPDATE coordinator.runs
           SET status = 'cancelled', finished_at = now(),
               error_message = 'cancelled: the job was removed (history kept)'
         WHERE runs.id = p_run_id
        RETURNING runs.category INTO category;  -- (set: how the daemon tells this case)
        outcome := 'saved';
    ELSIF r.trigger = 'schedule' THEN
        -- The deadline it served is still the job's saved one (the claim does not move it):
        -- it stands, to be claimed again.
        DELETE FROM coordinator.runs WHERE runs.id = p_run_id;
        outcome := 'saved';
    ELSE
        UPDATE coordinator.runs
           SET status = 'queued', claimed_at = NULL, started_at = NULL, instance = NULL,
               schedule_version = NULL, error_cause = NULL, error_message = NULL,
               category = NULL, retryable = NULL
         WHERE runs.id = p_run_id
        RETURNING runs.id, runs.due_at INTO retry_run_id, retry_due_at;
        outcome := 'saved';
    END IF;
    job_id := j.id;
    paused := j.paused;
    invalid := j.invalid_reason IS NOT NULL;
    schedule_version := j.schedule_version;
    next_run_at := j.next_run_at;
END
$$;

REVOKE EXECUTE ON FUNCTION coordinator._give_back(bigint, bigint, timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION coordinator._give_back(bigint, bigint, timestamptz) TO coordinator_daemon;

-- As in 0012, plus: an item whose status is 'queued' is a give-back (_give_back).
CREATE OR REPLACE FUNCTION coordinator._settle_each(p_items json, p_isolate boolean) RETURNS TABLE (
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
                    retryable boolean, jitter double precision, cursor jsonb, findings jsonb,
                    jid bigint, ca timestamptz)
          LEFT JOIN coordinator.runs r ON r.id = x.run
         ORDER BY coalesce(r.job_id, x.jid), x.i
    LOOP
        i := item.i;
        err_state := NULL;
        err_message := NULL;
        IF p_isolate THEN
            BEGIN
                IF item.status = 'queued' THEN
                    SELECT * INTO s FROM coordinator._give_back(item.run, item.jid, item.ca);
                ELSE
                    SELECT * INTO s FROM coordinator._settle(item.run, item.status, item.started,
                                                             item.finished, item.count, item.extra,
                                                             item.cause, item.message, item.v,
                                                             item.next, item.category,
                                                             item.retryable, item.jitter,
                                                             item.cursor -> 'v', item.findings);
                END IF;
            EXCEPTION WHEN others THEN
                err_state := SQLSTATE;
                err_message := SQLERRM;
                outcome := NULL;
                RETURN NEXT;
                CONTINUE;
            END;
        ELSE
            IF item.status = 'queued' THEN
                SELECT * INTO s FROM coordinator._give_back(item.run, item.jid, item.ca);
            ELSE
                SELECT * INTO s FROM coordinator._settle(item.run, item.status, item.started,
                                                         item.finished, item.count, item.extra,
                                                         item.cause, item.message, item.v,
                                                         item.next, item.category,
                                                         item.retryable, item.jitter,
                                                         item.cursor -> 'v', item.findings);
            END IF;
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
