-- A dispatch wake says when its run was created (#14's claim-ahead tests, 2026-12-02).
--
-- The daemon orders the manual runs of one priority first triggered, first served. A run
-- it reads in a refresh is ordered by its created_at, by the database's clock; a run it
-- heard of by its dispatch wake was ordered by when the wake came, by the daemon's clock:
-- later than its created_at by the wake's latency, and by any difference between the two
-- hosts' clocks. So a run triggered after another could be served before it, when the
-- other came by its wake and this one by a refresh running at that moment (a test that
-- triggered three jobs back to back saw the second start first in 3 of 7 full runs under
-- load), and a daemon whose clock ran ahead of the database's put every woken run behind
-- those a refresh found.
--
-- The dispatch payload now carries "at": the run's created_at, in integer microseconds
-- since the epoch (what the refresh reads, to the microsecond, and exact in JSON). Same
-- channel, same other keys. A daemon before this file ignores a payload with a key it
-- does not know (wake.ignored): a run triggered between `coordinator migrate` and that
-- daemon's restart starts at the restart, whose first refresh reads it (or at a refresh
-- something else asks for first). Upgrade the schema, then restart the daemon.
--
-- Redefined, each from its latest definition with only the payload changed:
-- trigger() (0019), _runs_wake() (0019), _dispatch_queued() (0022). In trigger() the new
-- run's created_at is the transaction's now() (the column's default), so nothing is read
-- back: the payload costs one expression more.

-- trigger() as in 0019, its payload with "at".

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
        RAISE EXCEPTION 'args must be a JSON object' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    LOOP
        SELECT r.id, r.status INTO run_id, run_status FROM coordinator.runs r
         WHERE r.job_id = jid
           AND r.status IN ('queued', 'pending', 'running', 'unresolved', 'cancel_requested',
                            'paused');
        IF run_id IS NOT NULL THEN
            IF run_status = 'paused' THEN
                -- Concurrent triggers all get here; the row lock lets one of them change it.
                UPDATE coordinator.runs SET status = 'queued'
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

-- The runs wake as in 0019, a lone queued run's payload with "at".

CREATE OR REPLACE FUNCTION coordinator._runs_wake() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    n      bigint;
    rid    bigint;
    jid    bigint;
    queued boolean;
    created timestamptz;
BEGIN
    IF coordinator._wakes_suppressed() THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' THEN
        SELECT count(*), min(id), false INTO n, rid, queued
          FROM (SELECT id FROM old_rows LIMIT 2) s;
    ELSE
        SELECT count(*), min(id), min(job_id), bool_and(status = 'queued'), min(created_at)
          INTO n, rid, jid, queued, created
          FROM (SELECT id, job_id, status, created_at FROM new_rows LIMIT 2) s;
    END IF;
    IF n = 0 THEN
        RETURN NULL;  -- the statement touched no row
    ELSIF n = 1 AND queued THEN
        -- A manual dispatch: the daemon claims it directly, without waiting for a refresh.
        -- The job's priority and worker type come along so that admission can order it
        -- and check availability without a query.
        PERFORM pg_notify('coordinator', json_build_object(
                    'run', rid, 'dispatch', true, 'job', j.id, 'priority', j.priority,
                    'worker', CASE WHEN j.target->>'kind' = 'worker'
                                   THEN j.target->>'type' END,
                    'at', (extract(epoch FROM created) * 1000000)::bigint)::text)
           FROM coordinator.jobs j
          WHERE j.id = jid;
    ELSIF n = 1 THEN
        PERFORM pg_notify('coordinator', json_build_object('run', rid)::text);
    ELSE
        PERFORM pg_notify('coordinator', '{"runs": "many"}');
    END IF;
    RETURN NULL;
END
$$;

-- As in 0022, its payload with "at".

CREATE OR REPLACE FUNCTION coordinator._dispatch_queued(p_job bigint) RETURNS void
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    run_id   bigint;
    priority text;
    worker   text;
    created  timestamptz;
BEGIN
    IF coordinator._wakes_suppressed() THEN
        RETURN;
    END IF;
    SELECT j.priority, CASE WHEN j.target->>'kind' = 'worker' THEN j.target->>'type' END
      INTO priority, worker
      FROM coordinator.jobs j
     WHERE j.id = p_job AND NOT j.paused AND j.invalid_reason IS NULL
       AND j.removed_at IS NULL;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT r.id, r.created_at INTO run_id, created FROM coordinator.runs r
     WHERE r.job_id = p_job AND r.status = 'queued' AND (r.due_at IS NULL OR r.due_at <= now());
    IF run_id IS NOT NULL THEN
        PERFORM pg_notify('coordinator', json_build_object(
                    'run', run_id, 'dispatch', true, 'job', p_job, 'priority', priority,
                    'worker', worker,
                    'at', (extract(epoch FROM created) * 1000000)::bigint)::text);
    END IF;
END
$$;
