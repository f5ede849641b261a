-- Lock order (found in review): coordinator.cancel and coordinator.resolve locked the run
-- and then, to clear a deadline, its job -- the reverse of every claim and settlement
-- (job, then run). A cancel of a waiting retry at the moment the daemon claims it, or a
-- resolve meeting a deadline claim waiting on the run, could deadlock. Both now lock the
-- job first. Everything else is as before.
--
-- Redefined here, each from its latest definition: resolve (0007), cancel (0012).
-- Every function runs with enable_seqscan = off (0004).

CREATE OR REPLACE FUNCTION coordinator.resolve(run_id bigint, outcome text) RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off AS $$
#variable_conflict use_variable
DECLARE
    r      coordinator.runs;
    new_id bigint;
BEGIN
    IF run_id IS NULL OR outcome IS NULL THEN
        PERFORM coordinator._require(run_id, 'run_id');
        PERFORM coordinator._require(outcome, 'outcome');
    END IF;
    IF outcome NOT IN ('failed', 'succeeded', 'retry') THEN
        RAISE EXCEPTION 'outcome must be failed, succeeded or retry, not %', outcome
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The job's row first, then the run's: the order of every claim and settlement.
    PERFORM 1 FROM coordinator.jobs j
     WHERE j.id = (SELECT x.job_id FROM coordinator.runs x WHERE x.id = run_id)
       FOR NO KEY UPDATE OF j;
    SELECT * INTO r FROM coordinator.runs WHERE id = run_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown run %', run_id
            USING ERRCODE = 'no_data_found', HINT = 'coordinator.run_not_found';
    END IF;
    IF r.status <> 'unresolved' THEN
        RAISE EXCEPTION 'run % is %, only unresolved runs can be resolved', run_id, r.status
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    UPDATE coordinator.runs
       SET status = CASE WHEN outcome = 'succeeded' THEN 'succeeded' ELSE 'failed' END,
           finished_at = coalesce(finished_at, now()),
           error_message = concat_ws('; ', error_message, 'resolved by operator as ' || outcome)
     WHERE id = run_id;
    IF outcome = 'retry' THEN
        INSERT INTO coordinator.runs (job_id, trigger, status, args, attempt, scheduled_for,
                                      retry_of)
        VALUES (r.job_id, 'retry', 'queued', r.args, r.attempt + 1, r.scheduled_for, r.id)
        RETURNING id INTO new_id;
        RETURN new_id;
    END IF;
    UPDATE coordinator.jobs SET next_run_at = NULL, updated_at = now()
     WHERE id = r.job_id AND r.scheduled_for IS NOT NULL AND next_run_at = r.scheduled_for
       AND schedule_kind IN ('cron', 'interval');
    RETURN run_id;
END
$$;

CREATE OR REPLACE FUNCTION coordinator.cancel(run_id bigint) RETURNS void
LANGUAGE plpgsql SET enable_seqscan = off AS $$
#variable_conflict use_variable
DECLARE
    r coordinator.runs;
BEGIN
    PERFORM coordinator._require(run_id, 'run_id');
    -- The job's row first, then the run's: the order of every claim and settlement.
    PERFORM 1 FROM coordinator.jobs j
     WHERE j.id = (SELECT x.job_id FROM coordinator.runs x WHERE x.id = run_id)
       FOR NO KEY UPDATE OF j;
    SELECT * INTO r FROM coordinator.runs WHERE id = run_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown run %', run_id
            USING ERRCODE = 'no_data_found', HINT = 'coordinator.run_not_found';
    END IF;
    IF r.status NOT IN ('queued', 'paused') THEN
        RAISE EXCEPTION 'run % is %, only queued or paused runs can be cancelled', run_id, r.status
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    UPDATE coordinator.runs
       SET status = 'cancelled', finished_at = now(), paused_at = NULL,
           error_message = 'cancelled by operator'
     WHERE id = run_id;
    IF r.trigger = 'retry' AND r.scheduled_for IS NOT NULL THEN
        UPDATE coordinator.jobs SET next_run_at = NULL, updated_at = now()
         WHERE id = r.job_id AND next_run_at = r.scheduled_for
           AND schedule_kind IN ('cron', 'interval');
    END IF;
END
$$;
