-- Cancel a run that has not started: a queued run becomes `cancelled`. A running call
-- belongs to the daemon (its timeout or stop ends it) and an unresolved run is settled
-- with resolve(), so both are refused.
CREATE FUNCTION coordinator.cancel(run_id bigint) RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    r coordinator.runs;
BEGIN
    SELECT * INTO r FROM coordinator.runs WHERE id = run_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown run %', run_id
            USING ERRCODE = 'no_data_found', HINT = 'coordinator.run_not_found';
    END IF;
    IF r.status <> 'queued' THEN
        RAISE EXCEPTION 'run % is %, only queued runs can be cancelled', run_id, r.status
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    UPDATE coordinator.runs
       SET status = 'cancelled', finished_at = now(), error_message = 'cancelled by operator'
     WHERE id = run_id;
END
$$;
