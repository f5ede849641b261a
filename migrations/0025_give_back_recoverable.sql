-- Giving back a recoverable job's run that never started (2026-12-02).
--
-- A claimed run that cannot be sent (the last worker serving its type left, none may
-- run its namespace, the daemon lost its lead) is given back (0023): queued again, or a
-- run of the schedule removed so that its saved deadline stands. A recoverable job's run
-- was paused unsent instead, even one never started, because an operator's pause asked
-- while it was claimed leaves it `cancel_requested`, which _give_back (acting on a
-- `running` run only) answered 'already' and left so until a sweep. A paused run waits
-- for a trigger or its job's next tick: a manual recoverable job's run claimed as its
-- workers restarted stayed paused until someone resumed it.
--
-- Now such a run is given back like any other when it never started (resumes = 0; the
-- daemon still pauses one that ran before, whose first start and cursor must stay), and
-- _give_back ends a never-started `cancel_requested` run under the claim it names as the
-- operator asked: `paused`, as pause_run pauses a queued run ("paused by operator before
-- it started", no start, no claim), answering the new outcome 'paused' (the daemon logs
-- `became=paused`; nothing is queued for it). The deadline the run served, or one
-- overdue now, is spent as _settle spends it for a paused result, so that its job's
-- next tick resumes it, not the tick just paused: the give-back now carries the schedule
-- version it was claimed under and the next deadline, as every settlement item does.
--
-- A run of the schedule is removed when given back only if the claim made it (a fresh
-- tick: its deadline stands, or is owed no more): one that was there before the claim
-- (it paused, then a trigger queued it again or a tick resumed it; it never started) is
-- queued again, and the run id the trigger returned stays. (Made by the claim: created
-- in the claim's transaction, created_at = claimed_at, both that transaction's now().)
--
-- Redefined from 0023: _give_back (two trailing parameters: dropped and re-created,
-- granted again) and _settle_each (passes them on; same signature, its grants stay).
-- Every function runs with enable_seqscan = off (0004).

DROP FUNCTION coordinator._give_back(bigint, bigint, timestamptz);

CREATE FUNCTION coordinator._give_back(
    p_run_id             bigint,
    p_job_id             bigint,   -- the job it was claimed for (NULL: the run's)
    p_claimed_at         timestamptz,  -- the claim it undoes (NULL: whichever)
    p_version            integer DEFAULT NULL,      -- the schedule version it was claimed under
    p_next_run_at        timestamptz DEFAULT NULL,  -- the deadline after now, by that schedule
    OUT outcome          text,     -- 'saved' | 'paused' | 'already' | 'gone'
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
    j             coordinator.jobs;
    r             coordinator.runs;
    paused_unsent boolean;  -- cancel_requested under this claim, never started
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
    paused_unsent := FOUND AND r.status = 'cancel_requested' AND r.resumes = 0
                     AND (p_claimed_at IS NULL OR r.claimed_at = p_claimed_at);
    IF paused_unsent AND j.removed_at IS NULL THEN
        -- An operator paused it (pause_run) while it was claimed, before it was sent: the
        -- pause it asked, as pause_run pauses a queued run, never started. (Its job
        -- removed meanwhile: cancelled below, as a running one.)
        UPDATE coordinator.runs
           SET status = 'paused', paused_at = now(), claimed_at = NULL, started_at = NULL,
               instance = NULL, schedule_version = NULL, error_cause = NULL,
               error_message = 'paused by operator before it started', category = NULL,
               retryable = NULL
         WHERE runs.id = p_run_id;
        -- The deadline it served (or one overdue now) is spent, as _settle spends it for
        -- a paused result: its job's next tick resumes it, not the tick just paused.
        IF j.schedule_version = p_version
           AND (r.trigger = 'schedule'
                OR (r.scheduled_for IS NOT NULL AND j.next_run_at = r.scheduled_for)
                OR j.next_run_at <= now()) THEN
            UPDATE coordinator.jobs SET next_run_at = p_next_run_at, updated_at = now()
             WHERE jobs.id = j.id
            RETURNING * INTO j;
        END IF;
        outcome := 'paused';
    ELSIF NOT FOUND OR (r.status <> 'running' AND NOT paused_unsent)
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
    ELSIF r.trigger = 'schedule' AND r.created_at = r.claimed_at THEN
        -- Made by this claim (one transaction: the same now()): a tick whose deadline is
        -- still the job's saved one (the claim does not move it), to be claimed again,
        -- or, the schedule edited or the job resumed since, owed no more. (A run of the
        -- schedule that was there before this claim -- paused, then queued again by a
        -- trigger or resumed by a tick -- is queued again below: the id the trigger
        -- returned must stay, and its deadline was spent when it paused.)
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

REVOKE EXECUTE ON FUNCTION coordinator._give_back(bigint, bigint, timestamptz, integer, timestamptz)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION coordinator._give_back(bigint, bigint, timestamptz, integer, timestamptz)
    TO coordinator_daemon;

-- As in 0023, but a give-back passes its schedule version and next deadline on.
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
                    SELECT * INTO s FROM coordinator._give_back(item.run, item.jid, item.ca, item.v,
                                                             item.next);
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
                SELECT * INTO s FROM coordinator._give_back(item.run, item.jid, item.ca, item.v,
                                                             item.next);
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
