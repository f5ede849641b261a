-- A paused run queued again by a trigger leaves its pause's words behind (found by a
-- helper resuming runs from the CLI, 2026-12-02).
--
-- trigger() of a job whose run is paused queues that run again (it resumes from its
-- cursor when claimed). It changed the status only, so until the claim, which clears
-- them, the queued run still said "paused by operator" in error_message (and its cause):
-- `runs show --json`, the admin API and SQL readers showed a run waiting to resume as if
-- that were its error. The page and the CLI's text hid it (RunView.standing_error); the
-- row now says nothing it does not mean. paused_at stays until the claim, as before: when
-- it was paused is still true.
--
-- Its refusal of args names them (COLUMN 'args'), and NULL args are 22004 as README
-- says of every required argument (they were 22023 without a COLUMN).
--
-- Redefined from its latest definition (0027), with only that UPDATE and that refusal
-- changed.

CREATE OR REPLACE FUNCTION coordinator.trigger(namespace text, name text, args jsonb DEFAULT '{}')
RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off AS $$
#variable_conflict use_variable
DECLARE
    jid        bigint;
    priority   text;
    worker     text;
    run_id     bigint;
    run_status text;
    tries      integer := 0;
    wake       boolean;
    origin     text;
    unused     text;
BEGIN
    IF namespace IS NULL OR name IS NULL THEN
        PERFORM coordinator._require(namespace, 'namespace');
        PERFORM coordinator._require(name, 'name');
    END IF;
    IF NOT coordinator._may(namespace, true) THEN
        PERFORM coordinator._require_namespace(namespace, true);
    END IF;
    SELECT j.id, j.priority,
           CASE WHEN j.target->>'kind' = 'worker' THEN j.target->>'type' END
      INTO jid, priority, worker
      FROM coordinator.jobs j
     WHERE j.namespace = namespace AND j.name = name AND j.removed_at IS NULL;
    IF jid IS NULL THEN
        RAISE EXCEPTION 'unknown job %/%', namespace, name
            USING ERRCODE = 'no_data_found', HINT = 'coordinator.job_not_found';
    END IF;
    IF args IS NULL OR jsonb_typeof(args) <> 'object' THEN
        PERFORM coordinator._require(args, 'args');  -- (NULL: 22004, as README says)
        RAISE EXCEPTION 'args must be a JSON object'
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'args';
    END IF;
    LOOP
        SELECT r.id, r.status INTO run_id, run_status FROM coordinator.runs r
         WHERE r.job_id = jid
           AND r.status IN ('queued', 'pending', 'running', 'unresolved', 'cancel_requested',
                            'paused');
        IF run_id IS NOT NULL THEN
            IF run_status = 'paused' THEN
                -- Concurrent triggers all get here; the row lock lets one of them change it.
                UPDATE coordinator.runs
                   SET status = 'queued', error_cause = NULL, error_message = NULL
                 WHERE id = run_id AND status = 'paused';
            END IF;
            RETURN run_id;
        END IF;
        wake := NOT coordinator._wakes_suppressed();
        IF wake THEN
            -- (Assignments, not PERFORM: evaluated without an executor of their own.)
            origin := current_setting('coordinator.origin', true);
            unused := set_config('coordinator.origin', 'quiet', true);
        END IF;
        -- A concurrent trigger may insert first: ON CONFLICT waits for it, and the next
        -- iteration's fresh snapshot sees its run.
        INSERT INTO coordinator.runs (job_id, trigger, status, args)
        VALUES (jid, 'manual', 'queued', args)
        ON CONFLICT (job_id)
           WHERE status IN ('queued', 'pending', 'running', 'unresolved', 'cancel_requested',
                            'paused')
        DO NOTHING
        RETURNING id INTO run_id;
        IF wake THEN
            unused := set_config('coordinator.origin', coalesce(origin, ''), true);
        END IF;
        IF run_id IS NOT NULL THEN
            IF wake THEN
                -- A manual dispatch: the daemon claims it directly (see _runs_wake).
                PERFORM pg_notify('coordinator', json_build_object(
                            'run', run_id, 'dispatch', true, 'job', jid, 'priority', priority,
                            'worker', worker,
                            'at', (extract(epoch FROM now()) * 1000000)::bigint)::text);
            END IF;
            RETURN run_id;
        END IF;
        tries := tries + 1;
        IF tries >= 3 THEN
            -- Only a snapshot that cannot see the committed conflicting run gets here
            -- (REPEATABLE READ or SERIALIZABLE callers); let them retry the transaction.
            RAISE EXCEPTION 'concurrent trigger of %/%; retry the transaction', namespace, name
                USING ERRCODE = 'serialization_failure';
        END IF;
    END LOOP;
END
$$;
