-- resume() wakes the daemon for the job's queued run, as trigger() does (found by a new
-- user's first hour: after `jobs resume`, a run triggered while the job was paused
-- waited up to the 30 s refresh spacing, while a trigger runs within milliseconds).
--
-- A paused job's trigger queues its run; resuming the job let only the jobs wake trigger
-- speak (a coalesced refresh: "something about job N changed"). Now resume() also raises
-- the dispatch wake of that run, the payload trigger() sends ({"run", "dispatch", "job",
-- "priority", "worker"}), when the job was paused, is valid, the run is queued and due
-- (a retry waiting for its backoff is armed by the refresh as before), and the caller's
-- session does not suppress wakes. The daemon claims it at once, under the same checks
-- (the claim reads the job as committed); the refresh still follows, coalesced.
--
-- Redefined, from its latest definition: resume (0001, with 0004's enable_seqscan = off;
-- same signature, so its grants stay).

CREATE OR REPLACE FUNCTION coordinator.resume(namespace text, name text) RETURNS void
LANGUAGE plpgsql SET enable_seqscan = off AS $$
#variable_conflict use_variable
DECLARE
    jid      bigint := coordinator._job_id(namespace, name, true);
    priority text;
    worker   text;
    valid    boolean;
    run_id   bigint;
BEGIN
    -- Resuming a recurring job forgets the deadline saved before the pause: ticks that
    -- fell inside the pause are not owed. A one-shot job keeps its instant.
    UPDATE coordinator.jobs
       SET paused = false,
           next_run_at = CASE WHEN schedule_kind IN ('cron', 'interval') THEN NULL
                              ELSE next_run_at END,
           updated_at = now()
     WHERE id = jid AND paused
    RETURNING jobs.priority,
              CASE WHEN jobs.target->>'kind' = 'worker' THEN jobs.target->>'type' END,
              jobs.invalid_reason IS NULL
         INTO priority, worker, valid;
    IF NOT FOUND OR NOT valid OR coordinator._wakes_suppressed() THEN
        RETURN;
    END IF;
    SELECT r.id INTO run_id FROM coordinator.runs r
     WHERE r.job_id = jid AND r.status = 'queued' AND (r.due_at IS NULL OR r.due_at <= now());
    IF run_id IS NOT NULL THEN
        PERFORM pg_notify('coordinator', json_build_object(
                    'run', run_id, 'dispatch', true, 'job', jid, 'priority', priority,
                    'worker', worker)::text);
    END IF;
END
$$;
