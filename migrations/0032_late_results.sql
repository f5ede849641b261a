-- A result that comes back after another daemon swept its run is saved, not dropped
-- (found by a helper killing a leader's sessions while a standby waited, 2026-12-02).
--
-- A leader whose lock session ends while a standby waits steps down: the standby takes
-- the lock, sweeps the old leader's running runs (unresolved, or a retry queued for an
-- idempotent job, or paused for a recoverable one), and leads. The old leader's calls
-- go on meanwhile, and it settles each result as it comes, up to its stop timeout. Its
-- settlement found the run no longer running and answered 'already', which the daemon
-- took for "saved before": the result was dropped without a line, and the run stayed
-- unresolved, blocking its job until an operator resolved it by hand, although the
-- result that would resolve it had been in hand. The same befell a spooled result
-- replayed after another daemon's sweep.
--
-- The daemon now sends the items that came back 'already' once more, to _settle_late:
-- under the job's row lock, a run still `unresolved` is put back to `running` and
-- settled as any result is (its next deadline, its retry policy), in a subtransaction
-- per item so that a refusal leaves the run unresolved, not running; the outcome is
-- 'late', and a notification wakes the daemon that leads now (the daemon's own sessions
-- wake nobody: its triggers are quiet for it) so that it re-reads the job. A run that
-- another daemon or an operator ended otherwise (a retry queued, paused, resolved)
-- keeps what they decided: the outcome is 'superseded' (its end was not this result's,
-- by its finish time), and the daemon says so in a warning instead of dropping it
-- silently. An item whose result was in fact saved before (a retried statement whose
-- first answer was lost) is 'already', as before.
--
-- New: _settle_late. Nothing else changes; the hot path (_settle_many, _settle) is as
-- it was, and _settle_late is only called for items that came back 'already'.

CREATE FUNCTION coordinator._settle_late(p_items json) RETURNS TABLE (
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
#variable_conflict use_column
DECLARE
    item    record;
    s       record;
    swept   boolean;
    ended   timestamptz;
BEGIN
    FOR item IN
        SELECT e.value AS raw, (e.value->>'i')::integer AS i, (e.value->>'run')::bigint AS run,
               (e.value->>'finished')::timestamptz AS finished, r.job_id AS job
          FROM json_array_elements(p_items) e
          LEFT JOIN coordinator.runs r ON r.id = (e.value->>'run')::bigint
         ORDER BY r.job_id, (e.value->>'i')::integer
    LOOP
        i := item.i;
        err_state := NULL;
        err_message := NULL;
        BEGIN
            -- The job's row first, then the run's: the order of every claim and settlement.
            PERFORM 1 FROM coordinator.jobs j WHERE j.id = item.job FOR NO KEY UPDATE OF j;
            UPDATE coordinator.runs r SET status = 'running'
             WHERE r.id = item.run AND r.status = 'unresolved';
            swept := FOUND;
            SELECT * INTO s FROM coordinator._settle_each(json_build_array(item.raw), false);
            IF swept AND s.outcome = 'saved' THEN
                s.outcome := 'late';
                PERFORM pg_notify('coordinator', json_build_object('job', item.job)::text);
            ELSIF swept THEN
                -- (Not saved after all: leave the run as the sweep left it.)
                RAISE EXCEPTION 'run % could not be settled late: %', item.run, s.outcome;
            ELSIF s.outcome = 'already' THEN
                SELECT coalesce(r.finished_at, r.paused_at) INTO ended
                  FROM coordinator.runs r WHERE r.id = item.run;
                IF ended IS DISTINCT FROM item.finished THEN
                    s.outcome := 'superseded';
                END IF;
            END IF;
        EXCEPTION WHEN others THEN
            err_state := SQLSTATE;
            err_message := SQLERRM;
            outcome := NULL;
            job_id := NULL; paused := NULL; invalid := NULL; schedule_version := NULL;
            next_run_at := NULL; retry_run_id := NULL; retry_due_at := NULL;
            exhausted := NULL; category := NULL;
            RETURN NEXT;
            CONTINUE;
        END;
        outcome := s.outcome; job_id := s.job_id; paused := s.paused;
        invalid := s.invalid; schedule_version := s.schedule_version;
        next_run_at := s.next_run_at;
        retry_run_id := s.retry_run_id; retry_due_at := s.retry_due_at;
        exhausted := s.exhausted; category := s.category;
        RETURN NEXT;
    END LOOP;
END
$$;
