-- Cheaper enqueue (issue #14): what an application pays inside its own transaction for
-- coordinator.trigger(), and what the jobs table's triggers add to the daemon's writes.
--
-- Where a trigger() of a job without an outstanding run spent its server time (0018;
-- pg_stat_statements with track = all and track_functions = all, pgbench, one
-- connection, one call per transaction; microseconds per call): 300 in all, of which the
-- INSERT of the run 217 -- the runs wake trigger 53 (PL/pgSQL, two statements), the
-- runs guard 23 (a lookup and a call, for a role that can never be refused), the
-- foreign-key check 7, and the rest starting the statement: perf showed ~13% of the
-- backend in ExecConstraints re-reading the CHECK constraints and ~3% in the guard's and
-- the categorizer's WHEN clauses --, the call of _job_id 36, the outstanding-run lookup
-- 3, and committing (a WAL flush) on top. For a role confined to its namespaces (0014)
-- it was four times that: _namespaces(), called eight times per trigger(), was planned
-- again at every call (60 us each).
--
-- After this file (same measurement): 185 in all, the INSERT 106. Backend CPU per call
-- (utime + stime from /proc of the serving backend, 10,000 calls, the two schemas in
-- alternating blocks of 500 on one cluster; ranges over 4 runs): 299-362 -> 217-269 us
-- (superuser), 1,131-1,265 -> 475-578 us (a coordinator_app role granted the
-- namespace), 56 -> 47 us for a trigger of a job whose run is already queued. What is
-- left is PostgreSQL's own cost of one INSERT with five indexes, eight CHECK
-- constraints, a foreign key and ON CONFLICT, and the commit's WAL flush.
--
-- The daemon's bulk first-deadline UPDATE (perf of 200,000 rows written as the daemon):
-- the BEFORE UPDATE row triggers cost ~15% of it -- ~7% locking each row first, which
-- PostgreSQL does for any table with a BEFORE UPDATE row trigger whatever its WHEN
-- clause, and ~4% the guard's WHEN clause, one current_setting() per row -- and the
-- wake trigger's transition table ~5% (every row copied, though the daemon's session
-- never reads it: PostgreSQL captures it whenever such a trigger exists). Neither goes
-- without dropping a rule (the unpause rule and the refusals need BEFORE row triggers;
-- the one-job-or-many payload needs the transition table); what goes here is the call
-- of the wake function per statement, per settlement and per claim.
--
-- Nothing here changes a rule, an error or a payload: the same functions with the same
-- signatures and grants, the same refusals in the same order, the same NOTIFY channel and
-- payloads, the same row-level security, the same constraint names and rules.
-- Every PL/pgSQL function runs with enable_seqscan = off (0004).

-- ---------------------------------------------------------------------------------------
-- The namespaces of the current role (0014), in PL/pgSQL with a plan kept for the
-- session. Every statement an application confined to its namespaces runs on jobs or
-- runs calls _namespaces() once (the policies' InitPlan), and so does each check of
-- _may(): eight times per trigger(). A SQL function that cannot be inlined (this one
-- aggregates a table) is parsed, analysed and planned again at each of those calls
-- (about 60 us each, half of a confined trigger()'s server time). In PL/pgSQL the plan
-- is cached -- but the plan cache, comparing its generic plan with the custom plans for
-- p_operate, kept planning a custom one at every call (pg_stat_statements: as many plans
-- as calls); plan_cache_mode = force_generic_plan keeps the one plan (the same shape:
-- this small table is read whole either way). Same query, same answer, still STABLE and
-- SECURITY INVOKER (the grants it sees are the caller's: grants_own).
-- ---------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION coordinator._namespaces(p_operate boolean) RETURNS text[]
LANGUAGE plpgsql STABLE SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN (SELECT coalesce(array_agg(DISTINCT g.namespace), '{}')
              FROM coordinator.namespace_grants g
             WHERE pg_catalog.pg_has_role(pg_catalog.to_regrole(g.role), 'USAGE')
               AND (NOT p_operate OR NOT g.read_only));
END
$$;

-- ---------------------------------------------------------------------------------------
-- CHECK constraints of runs, stored compactly. PostgreSQL reads a table's CHECK
-- constraints from their stored node trees and plans them again at the start of every
-- INSERT or UPDATE statement (ExecConstraints -> stringToNode: 0015's measurement, and
-- here about a tenth of trigger()'s server time). A list written `IN ('a', 'b', ...)` is
-- stored as one constant node per element; the same test against one array constant is
-- stored in about half the text and needs no folding. Same names, same rules, same
-- order of evaluation (by name), so the same errors; one pass over runs validates them.
-- ---------------------------------------------------------------------------------------

ALTER TABLE coordinator.runs
    DROP CONSTRAINT runs_status_check,
    ADD CONSTRAINT runs_status_check
        CHECK (status = ANY ('{queued,pending,running,cancel_requested,paused,succeeded,failed,'
                             'timed_out,cancelled,unresolved}'::text[])),
    DROP CONSTRAINT runs_category_check,
    ADD CONSTRAINT runs_category_check
        CHECK (category = ANY ('{invalid-input,timeout,cancellation,external-dependency,'
                               'provider-failure,storage,unknown}'::text[])),
    DROP CONSTRAINT runs_error_cause_check,
    ADD CONSTRAINT runs_error_cause_check
        CHECK (error_cause = ANY ('{handler,timeout,crashed,lost}'::text[])),
    DROP CONSTRAINT runs_trigger_check,
    ADD CONSTRAINT runs_trigger_check CHECK (trigger = ANY ('{schedule,manual,retry}'::text[]));

-- ---------------------------------------------------------------------------------------
-- Row triggers that fire only when they have something to do. A trigger's WHEN clause is
-- read and planned at the start of each statement too, and a trigger that fires costs a
-- PL/pgSQL call (with its SET clause) per row.
--
-- The guards (0014) only word a refusal, and for a role the policies do not confine
-- (the owner, a superuser, BYPASSRLS: row_security_active is false) they never refuse:
-- _require_namespace asks _may, whose first test is exactly that. So they are not fired
-- for such roles at all, as they already are not for the daemon's sessions
-- (`current_setting(...) IS DISTINCT FROM 'daemon'` is `coalesce(..., '') <> 'daemon'`,
-- one node fewer). runs_categorize (0007): the same test against an array constant.
-- ---------------------------------------------------------------------------------------

-- The guard functions (0014) ask _may() first, as a plain expression, and call
-- _require_namespace() -- a statement and a PL/pgSQL call, which asks _may() again and
-- words the refusal -- only when it says no. A NULL namespace (a job the caller cannot
-- see) is still left to the policies: _require_namespace returns for it, when it is
-- called at all.
CREATE OR REPLACE FUNCTION coordinator._jobs_guard() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF NOT coordinator._may(OLD.namespace, true) THEN
            PERFORM coordinator._require_namespace(OLD.namespace, true);
        END IF;
    END IF;
    IF TG_OP = 'INSERT' OR NEW.namespace IS DISTINCT FROM OLD.namespace THEN
        IF NOT coordinator._may(NEW.namespace, true) THEN
            PERFORM coordinator._require_namespace(NEW.namespace, true);
        END IF;
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION coordinator._runs_guard() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    ns text;
BEGIN
    SELECT j.namespace INTO ns FROM coordinator.jobs j WHERE j.id = NEW.job_id;
    IF NOT coordinator._may(ns, true) THEN
        PERFORM coordinator._require_namespace(ns, true);
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.job_id IS DISTINCT FROM OLD.job_id THEN
        SELECT j.namespace INTO ns FROM coordinator.jobs j WHERE j.id = OLD.job_id;
        IF NOT coordinator._may(ns, true) THEN
            PERFORM coordinator._require_namespace(ns, true);
        END IF;
    END IF;
    RETURN NEW;
END
$$;

DROP TRIGGER jobs_guard ON coordinator.jobs;
CREATE TRIGGER jobs_guard BEFORE INSERT OR UPDATE ON coordinator.jobs
    FOR EACH ROW
    WHEN (current_setting('coordinator.origin', true) IS DISTINCT FROM 'daemon'
          AND pg_catalog.row_security_active('coordinator.jobs'::regclass))
    EXECUTE FUNCTION coordinator._jobs_guard();
DROP TRIGGER runs_guard ON coordinator.runs;
CREATE TRIGGER runs_guard BEFORE INSERT OR UPDATE ON coordinator.runs
    FOR EACH ROW
    WHEN (current_setting('coordinator.origin', true) IS DISTINCT FROM 'daemon'
          AND pg_catalog.row_security_active('coordinator.jobs'::regclass))
    EXECUTE FUNCTION coordinator._runs_guard();
DROP TRIGGER runs_categorize ON coordinator.runs;
CREATE TRIGGER runs_categorize BEFORE INSERT OR UPDATE OF status ON coordinator.runs
    FOR EACH ROW
    WHEN (NEW.category IS NULL AND NEW.status = ANY ('{failed,timed_out,cancelled}'::text[]))
    EXECUTE FUNCTION coordinator._runs_categorize();

-- ---------------------------------------------------------------------------------------
-- The runs wake (0001), with one statement less to run: the new (or old) rows carry the
-- run's job, so the dispatch payload reads the job by its key instead of joining the run
-- back from the table (under row-level security the run is visible exactly when its job
-- is: runs_read). Same payloads: {"run": id, "dispatch": true, "job": ..., "priority":
-- ..., "worker": ...} for one queued run (none if its job is not visible), {"run": id} for
-- one other run, {"runs": "many"} for more; none for no row or a suppressed session.
-- ---------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION coordinator._runs_wake() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    n      bigint;
    rid    bigint;
    jid    bigint;
    queued boolean;
BEGIN
    IF coordinator._wakes_suppressed() THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' THEN
        SELECT count(*), min(id), false INTO n, rid, queued
          FROM (SELECT id FROM old_rows LIMIT 2) s;
    ELSE
        SELECT count(*), min(id), min(job_id), bool_and(status = 'queued')
          INTO n, rid, jid, queued
          FROM (SELECT id, job_id, status FROM new_rows LIMIT 2) s;
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
                                   THEN j.target->>'type' END)::text)
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

-- ---------------------------------------------------------------------------------------
-- The wake triggers (0001) are not called at all where they would return at once: in the
-- daemon's sessions and quiet ones (sync, pause_run, and trigger() below), each of the
-- daemon's claims, settlements and first-deadline batches called a PL/pgSQL function (a
-- SET clause, a transition table registered) just to return. The WHEN clause is
-- _wakes_suppressed()'s test written out: a trigger's WHEN clause is planned at the start
-- of every statement, and an inlined SQL function would be parsed again each time.
-- ---------------------------------------------------------------------------------------

DROP TRIGGER jobs_wake_insert ON coordinator.jobs;
DROP TRIGGER jobs_wake_update ON coordinator.jobs;
DROP TRIGGER jobs_wake_delete ON coordinator.jobs;
DROP TRIGGER runs_wake_insert ON coordinator.runs;
DROP TRIGGER runs_wake_update ON coordinator.runs;
DROP TRIGGER runs_wake_delete ON coordinator.runs;
CREATE TRIGGER jobs_wake_insert AFTER INSERT ON coordinator.jobs
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT
    WHEN (coalesce(current_setting('coordinator.origin', true), '') <> ALL ('{daemon,quiet}'))
    EXECUTE FUNCTION coordinator._jobs_wake();
CREATE TRIGGER jobs_wake_update AFTER UPDATE ON coordinator.jobs
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT
    WHEN (coalesce(current_setting('coordinator.origin', true), '') <> ALL ('{daemon,quiet}'))
    EXECUTE FUNCTION coordinator._jobs_wake();
CREATE TRIGGER jobs_wake_delete AFTER DELETE ON coordinator.jobs
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT
    WHEN (coalesce(current_setting('coordinator.origin', true), '') <> ALL ('{daemon,quiet}'))
    EXECUTE FUNCTION coordinator._jobs_wake();
CREATE TRIGGER runs_wake_insert AFTER INSERT ON coordinator.runs
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT
    WHEN (coalesce(current_setting('coordinator.origin', true), '') <> ALL ('{daemon,quiet}'))
    EXECUTE FUNCTION coordinator._runs_wake();
CREATE TRIGGER runs_wake_update AFTER UPDATE ON coordinator.runs
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT
    WHEN (coalesce(current_setting('coordinator.origin', true), '') <> ALL ('{daemon,quiet}'))
    EXECUTE FUNCTION coordinator._runs_wake();
CREATE TRIGGER runs_wake_delete AFTER DELETE ON coordinator.runs
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT
    WHEN (coalesce(current_setting('coordinator.origin', true), '') <> ALL ('{daemon,quiet}'))
    EXECUTE FUNCTION coordinator._runs_wake();

-- ---------------------------------------------------------------------------------------
-- trigger() as in 0012, with two calls less:
--   * coordinator._job_id(namespace, name, false) (0014) is written inline. The same
--     refusals in the same order: a NULL namespace or name, a namespace the caller may
--     not operate (_require_namespace is called only when _may says no, and words the
--     refusal as before), an unknown (or removed) job, then bad args.
--   * The new run's wake is raised here, from what the job lookup read, instead of by
--     the runs wake trigger (the INSERT runs quiet, as sync's statements do): the same
--     dispatch payload, {"run", "dispatch", "job", "priority", "worker"}, built by the
--     same expression, raised at the same point of the caller's transaction, and none
--     when the caller's session is suppressed or no run was inserted. (A paused run
--     queued again still raises its wake from the trigger.)
-- Not merged: the job lookup and the outstanding-run lookup. As a join, once runs was
-- ANALYZEd nearly empty, its generic plan read the whole partial index of outstanding
-- runs on every call.
-- ---------------------------------------------------------------------------------------

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
                            'worker', worker)::text);
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
