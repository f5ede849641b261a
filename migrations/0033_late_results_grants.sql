-- _settle_late (0032) is the daemon's, as every function of its claims and settlements
-- is (0014, 0018, 0023, 0025): revoked from PUBLIC, granted to coordinator_daemon. (Row
-- security confined what a confined role could reach with it; nothing should tempt one
-- to call it.) And a give-back's answer is never 'superseded': a give-back has no end of
-- its own to compare (the run is queued again, or was claimed again since: 'already').
-- Found by a review of 0032, 2026-12-02.
--
-- Redefined: _settle_late, from 0032, with only that condition added.

CREATE OR REPLACE FUNCTION coordinator._settle_late(p_items json) RETURNS TABLE (
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
            ELSIF s.outcome = 'already' AND item.raw->>'status' IS DISTINCT FROM 'queued' THEN
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

REVOKE EXECUTE ON FUNCTION coordinator._settle_late(json) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION coordinator._settle_late(json) TO coordinator_daemon;
