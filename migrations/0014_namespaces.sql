-- Namespaces confined by PostgreSQL, version 14 (issue #17).
--
-- Until now a namespace was a label: any role that could call the SQL API could define,
-- trigger or read any namespace. From here PostgreSQL itself confines the roles of
-- applications to the namespaces they were granted, whether they call the SQL API or
-- write plain SQL on the tables.
--
-- Roles (cluster-wide, NOLOGIN, created here when missing; login roles are made members):
--   coordinator_admin   every namespace, and the grants themselves (grant_namespace,
--                       revoke_namespace): operators, the admin API's connection.
--   coordinator_daemon  every namespace: a daemon that does not log in as the schema's
--                       owner (see "The daemon" below).
--   coordinator_app     confined: only the namespaces granted (coordinator.namespace_grants)
--                       to the role or to a role it has the privileges of. A role that
--                       is none of these (and not the owner) sees nothing.
--
-- Row-level security on jobs, runs and findings (a run belongs to its job's namespace, a
-- finding to its run's):
--   read     SELECT the rows of the namespace;
--   operate  also INSERT, UPDATE and DELETE them (define, sync, trigger, pause, resume,
--            remove, cancel, resolve).
-- A read-only grant sees its rows and every write to them is refused. The SQL API's
-- functions stay SECURITY INVOKER: they run as the caller, under the same policies as the
-- caller's plain SQL (docs/design.md, "Namespaces and roles", says why). What this file
-- adds to them is the refusal's wording, `permission denied for namespace "billing"`
-- (SQLSTATE 42501, HINT coordinator.namespace_denied), from two places:
--   * _job_id (trigger, pause, resume, remove) checks the namespace before the lookup, so
--     a role without a grant is refused rather than told the job is unknown;
--   * a BEFORE row trigger on jobs and runs (define_job, sync, cancel, resolve, and plain
--     INSERT/UPDATE) refuses a write to a namespace the role may not operate.
-- The policies are the enforcement; the checks only word it. A row the role cannot see
-- is simply not there (an UPDATE or DELETE of it touches nothing; a lookup of it is
-- "unknown job"/"unknown run", which says nothing about other namespaces).
--
-- The daemon. Its sessions are not slowed: a daemon that connects as the schema's owner
-- (the role that ran `coordinator migrate`, the usual case) or as a role with BYPASSRLS is
-- exempt from the policies altogether (RLS is enabled, not forced: PostgreSQL adds no
-- qualifier to its statements); a daemon that connects as a member of coordinator_daemon
-- meets only `USING (true)`, which the planner folds away. The guard triggers are skipped
-- for its sessions (coordinator.origin = 'daemon', as the wake triggers already are; a
-- role that forges the setting only loses the wording: the policies still refuse).
-- bench/rls.py measures claims/s each way (README, docs/scaling.md).
--
-- Redefined here: _job_id (as in 0013_alerts_retention -- removed jobs are unknown --,
-- plus the namespace check). New: namespace_grants, _namespaces, _may,
-- _require_namespace, _jobs_guard, _runs_guard, grant_namespace, revoke_namespace, and
-- _declare (a worker's declared schedules, synced by the daemon). Not redefined, because
-- the policies and the guard triggers confine them as they are: define_job, sync and
-- remove (0013: alert, keep_last, retention, keep_history), cancel, resolve.
-- 0013's alert windows and retention are the daemon's and the operators': alert_windows
-- is granted to coordinator_admin and coordinator_daemon only, and so are _alert_open,
-- _prunable, _prune and _prune_preview (`coordinator prune` needs an unconfined role).
-- Every PL/pgSQL function runs with enable_seqscan = off (0004).

-- ---------------------------------------------------------------------------------------
-- Roles.
-- ---------------------------------------------------------------------------------------

DO $roles$
DECLARE
    wanted    text;
    can_make  boolean;
BEGIN
    SELECT rolsuper OR rolcreaterole INTO can_make FROM pg_roles WHERE rolname = current_user;
    FOREACH wanted IN ARRAY ARRAY['coordinator_admin', 'coordinator_daemon', 'coordinator_app']
    LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM pg_roles WHERE rolname = wanted);
        IF NOT can_make THEN
            RAISE EXCEPTION 'role % does not exist and % may not create roles', wanted, current_user
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'create coordinator_admin, coordinator_daemon and coordinator_app '
                             '(CREATE ROLE ... NOLOGIN) as a role with CREATEROLE, or migrate '
                             'as one';
        END IF;
        EXECUTE format('CREATE ROLE %I NOLOGIN', wanted);
    END LOOP;
END
$roles$;

-- ---------------------------------------------------------------------------------------
-- Grants: which role may read or operate which namespace.
-- ---------------------------------------------------------------------------------------

CREATE TABLE coordinator.namespace_grants (
    -- A role name (a login role, or a group: its members inherit the grant).
    role       name NOT NULL,
    namespace  text NOT NULL CONSTRAINT namespace_grants_namespace_check
                    CHECK (coordinator._namespace_problem(namespace) IS NULL),
    -- Read-only: SELECT only; otherwise the namespace may be operated too.
    read_only  boolean NOT NULL DEFAULT false,
    granted_at timestamptz NOT NULL DEFAULT now(),
    granted_by name NOT NULL DEFAULT current_user,
    PRIMARY KEY (role, namespace)
);

-- The namespaces the current role may read (p_operate false) or operate (true): those
-- granted to a role it has the privileges of (itself included; a dropped role's grants
-- count for nobody: to_regrole is NULL). Called once per statement by the policies (as
-- an InitPlan: `(SELECT coordinator._namespaces(...))::text[]`), never per row.
CREATE FUNCTION coordinator._namespaces(p_operate boolean) RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(DISTINCT g.namespace), '{}')
      FROM coordinator.namespace_grants g
     WHERE pg_catalog.pg_has_role(pg_catalog.to_regrole(g.role), 'USAGE')
       AND (NOT p_operate OR NOT g.read_only)
$$;

-- Whether the current role may read (or operate) p_namespace: always for a role the
-- policies do not confine (the owner, a superuser, BYPASSRLS, coordinator_admin and
-- coordinator_daemon members); else by its grants.
CREATE FUNCTION coordinator._may(p_namespace text, p_operate boolean) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT NOT pg_catalog.row_security_active('coordinator.jobs'::regclass)
        OR pg_catalog.pg_has_role('coordinator_admin', 'USAGE')
        OR pg_catalog.pg_has_role('coordinator_daemon', 'USAGE')
        OR p_namespace = ANY (coordinator._namespaces(p_operate))
$$;

-- Refuse, in the words of the issue, unless the current role may.
CREATE FUNCTION coordinator._require_namespace(p_namespace text, p_operate boolean)
RETURNS void
LANGUAGE plpgsql STABLE SET enable_seqscan = off AS $$
BEGIN
    IF p_namespace IS NULL OR coordinator._may(p_namespace, p_operate) THEN
        RETURN;
    END IF;
    RAISE EXCEPTION 'permission denied for namespace "%"', p_namespace
        USING ERRCODE = 'insufficient_privilege', HINT = 'coordinator.namespace_denied',
              DETAIL = CASE WHEN p_operate AND coordinator._may(p_namespace, false)
                            THEN format('role %s may only read namespace "%s"',
                                        current_user, p_namespace)
                            ELSE format('role %s has no grant for namespace "%s" '
                                        '(coordinator grant %s %s)', current_user,
                                        p_namespace, current_user, p_namespace) END;
END
$$;

-- ---------------------------------------------------------------------------------------
-- Row-level security.
-- ---------------------------------------------------------------------------------------

ALTER TABLE coordinator.jobs ENABLE ROW LEVEL SECURITY;
ALTER TABLE coordinator.runs ENABLE ROW LEVEL SECURITY;
ALTER TABLE coordinator.findings ENABLE ROW LEVEL SECURITY;
ALTER TABLE coordinator.namespace_grants ENABLE ROW LEVEL SECURITY;

-- Unconfined roles (the owner and BYPASSRLS roles skip every policy anyway).
CREATE POLICY jobs_unconfined ON coordinator.jobs
    TO coordinator_admin, coordinator_daemon USING (true) WITH CHECK (true);
CREATE POLICY runs_unconfined ON coordinator.runs
    TO coordinator_admin, coordinator_daemon USING (true) WITH CHECK (true);
CREATE POLICY findings_unconfined ON coordinator.findings
    TO coordinator_admin, coordinator_daemon USING (true) WITH CHECK (true);
CREATE POLICY grants_admin ON coordinator.namespace_grants
    TO coordinator_admin USING (true) WITH CHECK (true);

-- Applications. UPDATE sees the readable rows, so that the guard trigger can refuse a
-- write to a read-only namespace in words; WITH CHECK is the enforcement. DELETE has no
-- WITH CHECK, so it sees the operable rows only (a DELETE of read-only rows deletes
-- nothing; remove() says why).
CREATE POLICY jobs_read ON coordinator.jobs FOR SELECT TO coordinator_app
    USING (namespace = ANY ((SELECT coordinator._namespaces(false))::text[]));
CREATE POLICY jobs_insert ON coordinator.jobs FOR INSERT TO coordinator_app
    WITH CHECK (namespace = ANY ((SELECT coordinator._namespaces(true))::text[]));
CREATE POLICY jobs_update ON coordinator.jobs FOR UPDATE TO coordinator_app
    USING (namespace = ANY ((SELECT coordinator._namespaces(false))::text[]))
    WITH CHECK (namespace = ANY ((SELECT coordinator._namespaces(true))::text[]));
CREATE POLICY jobs_delete ON coordinator.jobs FOR DELETE TO coordinator_app
    USING (namespace = ANY ((SELECT coordinator._namespaces(true))::text[]));

-- A run is its job's: the job must be visible (readable), or operable for writes.
CREATE POLICY runs_read ON coordinator.runs FOR SELECT TO coordinator_app
    USING (EXISTS (SELECT 1 FROM coordinator.jobs j
                    WHERE j.id = runs.job_id
                      AND j.namespace = ANY ((SELECT coordinator._namespaces(false))::text[])));
CREATE POLICY runs_insert ON coordinator.runs FOR INSERT TO coordinator_app
    WITH CHECK (EXISTS (SELECT 1 FROM coordinator.jobs j
                         WHERE j.id = runs.job_id
                           AND j.namespace = ANY ((SELECT coordinator._namespaces(true))::text[])));
CREATE POLICY runs_update ON coordinator.runs FOR UPDATE TO coordinator_app
    USING (EXISTS (SELECT 1 FROM coordinator.jobs j
                    WHERE j.id = runs.job_id
                      AND j.namespace = ANY ((SELECT coordinator._namespaces(false))::text[])))
    WITH CHECK (EXISTS (SELECT 1 FROM coordinator.jobs j
                         WHERE j.id = runs.job_id
                           AND j.namespace = ANY ((SELECT coordinator._namespaces(true))::text[])));
CREATE POLICY runs_delete ON coordinator.runs FOR DELETE TO coordinator_app
    USING (EXISTS (SELECT 1 FROM coordinator.jobs j
                    WHERE j.id = runs.job_id
                      AND j.namespace = ANY ((SELECT coordinator._namespaces(true))::text[])));

-- A finding is its run's (the daemon writes them; an application reads its namespaces').
CREATE POLICY findings_read ON coordinator.findings FOR SELECT TO coordinator_app
    USING (EXISTS (SELECT 1 FROM coordinator.runs r JOIN coordinator.jobs j ON j.id = r.job_id
                    WHERE r.id = findings.run_id
                      AND j.namespace = ANY ((SELECT coordinator._namespaces(false))::text[])));
CREATE POLICY findings_write ON coordinator.findings TO coordinator_app
    USING (EXISTS (SELECT 1 FROM coordinator.runs r JOIN coordinator.jobs j ON j.id = r.job_id
                    WHERE r.id = findings.run_id
                      AND j.namespace = ANY ((SELECT coordinator._namespaces(true))::text[])))
    WITH CHECK (EXISTS (SELECT 1 FROM coordinator.runs r JOIN coordinator.jobs j
                          ON j.id = r.job_id
                         WHERE r.id = findings.run_id
                           AND j.namespace = ANY ((SELECT coordinator._namespaces(true))::text[])));

-- An application sees its own grants (those of roles it has the privileges of).
CREATE POLICY grants_own ON coordinator.namespace_grants FOR SELECT
    TO coordinator_app, coordinator_daemon
    USING (pg_catalog.pg_has_role(pg_catalog.to_regrole(role), 'USAGE'));

-- ---------------------------------------------------------------------------------------
-- The refusal's wording for writes (the policies enforce; these only say it).
-- ---------------------------------------------------------------------------------------

CREATE FUNCTION coordinator._jobs_guard() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        PERFORM coordinator._require_namespace(OLD.namespace, true);
    END IF;
    IF TG_OP = 'INSERT' OR NEW.namespace IS DISTINCT FROM OLD.namespace THEN
        PERFORM coordinator._require_namespace(NEW.namespace, true);
    END IF;
    RETURN NEW;
END
$$;

-- (A run's namespace is its job's, read as the caller sees it: a job the caller cannot
-- see is left to the policies.)
CREATE FUNCTION coordinator._runs_guard() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    ns text;
BEGIN
    SELECT j.namespace INTO ns FROM coordinator.jobs j WHERE j.id = NEW.job_id;
    PERFORM coordinator._require_namespace(ns, true);
    IF TG_OP = 'UPDATE' AND NEW.job_id IS DISTINCT FROM OLD.job_id THEN
        SELECT j.namespace INTO ns FROM coordinator.jobs j WHERE j.id = OLD.job_id;
        PERFORM coordinator._require_namespace(ns, true);
    END IF;
    RETURN NEW;
END
$$;

-- Not for the daemon's sessions: it may do everything, and its claims and settlements
-- must not pay a function call per row.
CREATE TRIGGER jobs_guard BEFORE INSERT OR UPDATE ON coordinator.jobs
    FOR EACH ROW
    WHEN (coalesce(current_setting('coordinator.origin', true), '') <> 'daemon')
    EXECUTE FUNCTION coordinator._jobs_guard();
CREATE TRIGGER runs_guard BEFORE INSERT OR UPDATE ON coordinator.runs
    FOR EACH ROW
    WHEN (coalesce(current_setting('coordinator.origin', true), '') <> 'daemon')
    EXECUTE FUNCTION coordinator._runs_guard();

-- As in 0013_alerts_retention (a removed job is unknown), plus: the caller must be
-- allowed to operate the namespace (every caller -- trigger, pause, resume, remove --
-- writes), checked before the lookup.
CREATE OR REPLACE FUNCTION coordinator._job_id(p_namespace text, p_name text, p_lock boolean)
RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    found_id bigint;
BEGIN
    IF p_namespace IS NULL OR p_name IS NULL THEN
        PERFORM coordinator._require(p_namespace, 'namespace');
        PERFORM coordinator._require(p_name, 'name');
    END IF;
    PERFORM coordinator._require_namespace(p_namespace, true);
    IF p_lock THEN
        SELECT id INTO found_id FROM coordinator.jobs
         WHERE namespace = p_namespace AND name = p_name AND removed_at IS NULL
           FOR NO KEY UPDATE;
    ELSE
        SELECT id INTO found_id FROM coordinator.jobs
         WHERE namespace = p_namespace AND name = p_name AND removed_at IS NULL;
    END IF;
    IF found_id IS NULL THEN
        RAISE EXCEPTION 'unknown job %/%', p_namespace, p_name
            USING ERRCODE = 'no_data_found', HINT = 'coordinator.job_not_found';
    END IF;
    RETURN found_id;
END
$$;

-- ---------------------------------------------------------------------------------------
-- Granting (`coordinator grant`, `coordinator revoke`).
-- ---------------------------------------------------------------------------------------

-- Let `role` read (read_only) or operate `namespace`, making it a member of
-- coordinator_app if it is not (which needs CREATEROLE, or ADMIN on coordinator_app).
-- Returns 'granted' (new), 'changed' (read-only became operate or back) or 'unchanged'.
CREATE FUNCTION coordinator.grant_namespace(role text, namespace text,
                                            read_only boolean DEFAULT false)
RETURNS text
LANGUAGE plpgsql SET enable_seqscan = off AS $$
#variable_conflict use_variable
DECLARE
    problem  text := coordinator._namespace_problem(namespace);
    previous boolean;
BEGIN
    PERFORM coordinator._require(role, 'role');
    PERFORM coordinator._require(namespace, 'namespace');
    PERFORM coordinator._require(read_only, 'read_only');
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION '%', problem USING ERRCODE = 'invalid_parameter_value', COLUMN = 'namespace';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = role) THEN
        RAISE EXCEPTION 'role "%" does not exist', role
            USING ERRCODE = 'undefined_object', COLUMN = 'role';
    END IF;
    IF role <> 'coordinator_app' AND NOT pg_has_role(role, 'coordinator_app', 'MEMBER') THEN
        BEGIN
            EXECUTE format('GRANT coordinator_app TO %I', role);
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE EXCEPTION 'role "%" is not a member of coordinator_app, and % may not make it one',
                            role, current_user
                USING ERRCODE = 'insufficient_privilege',
                      HINT = format('GRANT coordinator_app TO %I; as a role with CREATEROLE', role);
        END;
    END IF;
    SELECT g.read_only INTO previous FROM coordinator.namespace_grants g
     WHERE g.role = role AND g.namespace = namespace FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO coordinator.namespace_grants (role, namespace, read_only)
        VALUES (role, namespace, read_only);
        RETURN 'granted';
    ELSIF previous = read_only THEN
        RETURN 'unchanged';
    END IF;
    UPDATE coordinator.namespace_grants g
       SET read_only = read_only, granted_at = now(), granted_by = current_user
     WHERE g.role = role AND g.namespace = namespace;
    RETURN 'changed';
END
$$;

-- Withdraw a grant; whether there was one. (Membership of coordinator_app stays: a role
-- without grants sees nothing.)
CREATE FUNCTION coordinator.revoke_namespace(role text, namespace text) RETURNS boolean
LANGUAGE plpgsql SET enable_seqscan = off AS $$
#variable_conflict use_variable
BEGIN
    PERFORM coordinator._require(role, 'role');
    PERFORM coordinator._require(namespace, 'namespace');
    DELETE FROM coordinator.namespace_grants g WHERE g.role = role AND g.namespace = namespace;
    RETURN FOUND;
END
$$;

-- ---------------------------------------------------------------------------------------
-- Schedules declared in code (the worker protocol's `declare`, docs/worker-protocol.md).
-- ---------------------------------------------------------------------------------------

-- The daemon syncs a worker's declaration with the manifest's semantics -- coordinator.sync:
-- listed jobs created or updated, the namespace's other jobs paused -- but only when the
-- result would differ from what is stored: every worker declares when it connects, and
-- replicas declare the same thing; an unchanged declaration writes nothing and wakes
-- nothing. A listed job is unchanged when every field sync would write equals the row's:
-- the definition as given, the retry and misfire policies and `recoverable` as
-- define_job defaults them when an entry leaves them out (0007, 0012), alert, keep_last
-- and retention likewise (0013), and its pause: an entry without "paused" keeps an
-- operator's pause and lifts one sync made (0007's sync_paused). A removed job (0013,
-- history kept) is not the entry's job: its name is free. The caller has checked
-- the worker's right to the namespace (its token's scope); the daemon's session is not
-- confined.
CREATE FUNCTION coordinator._declare(p_namespace text, p_jobs jsonb)
RETURNS TABLE (created integer, updated integer, paused integer, unchanged boolean)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM jsonb_array_elements(p_jobs) e
         WHERE NOT EXISTS (
             SELECT 1 FROM coordinator.jobs j
              WHERE j.namespace = p_namespace AND j.name = e->>'name'
                AND j.removed_at IS NULL
                AND (j.schedule_kind, j.schedule, j.timezone, j.target, j.params, j.timeout,
                     j.priority, j.idempotent, j.invalid_reason, j.retries, j.retry_backoff,
                     j.retry_max_delay, j.misfire, j.misfire_grace, j.recoverable, j.alert,
                     j.keep_last, j.retention)
                    IS NOT DISTINCT FROM
                    (e->>'schedule_kind', e->>'schedule', coalesce(e->>'timezone', 'UTC'),
                     e->'target', coalesce(e->'params', '{}'), (e->>'timeout')::interval,
                     coalesce(e->>'priority', 'background'),
                     coalesce((e->>'idempotent')::boolean, false), e->>'invalid_reason',
                     coalesce((e->>'retries')::integer, 0),
                     coalesce((e->>'retry_backoff')::interval, interval '30 seconds'),
                     coalesce((e->>'retry_max_delay')::interval, interval '1 hour'),
                     coalesce(e->>'misfire', 'run-once'), (e->>'misfire_grace')::interval,
                     coalesce((e->>'recoverable')::boolean, false),
                     coalesce((e->>'alert')::boolean, true), (e->>'keep_last')::integer,
                     (e->>'retention')::interval)
                AND CASE WHEN e ? 'paused' THEN j.paused = (e->>'paused')::boolean
                         ELSE NOT (j.paused AND j.sync_paused) END))
       AND NOT EXISTS (
        SELECT 1 FROM coordinator.jobs j
         WHERE j.namespace = p_namespace AND j.removed_at IS NULL AND NOT j.paused
           AND NOT (j.name = ANY (ARRAY(SELECT e->>'name' FROM jsonb_array_elements(p_jobs) e))))
    THEN
        RETURN QUERY SELECT 0, 0, 0, true;
        RETURN;
    END IF;
    RETURN QUERY SELECT s.created, s.updated, s.paused, false
                   FROM coordinator.sync(p_namespace, p_jobs) s;
END
$$;

-- ---------------------------------------------------------------------------------------
-- Privileges. (New tables and functions of later migrations need theirs.)
-- ---------------------------------------------------------------------------------------

GRANT USAGE ON SCHEMA coordinator TO coordinator_admin, coordinator_daemon, coordinator_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON coordinator.jobs, coordinator.runs,
                                        coordinator.findings
    TO coordinator_admin, coordinator_daemon, coordinator_app;
GRANT SELECT ON coordinator.schema_migrations
    TO coordinator_admin, coordinator_daemon, coordinator_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON coordinator.namespace_grants TO coordinator_admin;
-- Tables later migrations create (as this role) are the admin's and the daemon's too; an
-- application's access to one waits for its policies (and their GRANT), as here.
ALTER DEFAULT PRIVILEGES IN SCHEMA coordinator
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO coordinator_admin, coordinator_daemon;
GRANT SELECT ON coordinator.namespace_grants TO coordinator_app, coordinator_daemon;
-- 0013's alert windows: the daemon's (and the admin's). An application has no business
-- there (a job it removes takes its windows with it: the foreign key's cascade runs as
-- the table's owner).
GRANT SELECT, INSERT, UPDATE, DELETE ON coordinator.alert_windows
    TO coordinator_admin, coordinator_daemon;

-- The grants are the admin's.
REVOKE EXECUTE ON FUNCTION coordinator.grant_namespace(text, text, boolean),
                           coordinator.revoke_namespace(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION coordinator.grant_namespace(text, text, boolean),
                          coordinator.revoke_namespace(text, text) TO coordinator_admin;

-- The daemon's own functions are the daemon's (an application gains nothing by calling
-- them -- they run under its policies -- but nothing should tempt it to).
REVOKE EXECUTE ON FUNCTION
    coordinator._claim(bigint, bigint, timestamptz, integer, text, text[], integer, integer,
                       integer, timestamptz, timestamptz),
    coordinator._settle(bigint, text, timestamptz, timestamptz, bigint, jsonb, text, text,
                        integer, timestamptz, text, boolean, double precision, jsonb, jsonb),
    coordinator._claim_many(text, text, text[], integer, integer, integer),
    coordinator._claim_each(json, text, text[], boolean),
    coordinator._settle_many(text),
    coordinator._settle_each(json, boolean),
    coordinator._sweep_lost(text),
    coordinator._checkpoint(bigint, jsonb, bigint, jsonb),
    coordinator._insert_findings(bigint, jsonb),
    coordinator._declare(text, jsonb),
    coordinator._alert_open(bigint, text, bigint, timestamptz, interval)
  FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    coordinator._claim(bigint, bigint, timestamptz, integer, text, text[], integer, integer,
                       integer, timestamptz, timestamptz),
    coordinator._settle(bigint, text, timestamptz, timestamptz, bigint, jsonb, text, text,
                        integer, timestamptz, text, boolean, double precision, jsonb, jsonb),
    coordinator._claim_many(text, text, text[], integer, integer, integer),
    coordinator._claim_each(json, text, text[], boolean),
    coordinator._settle_many(text),
    coordinator._settle_each(json, boolean),
    coordinator._sweep_lost(text),
    coordinator._checkpoint(bigint, jsonb, bigint, jsonb),
    coordinator._insert_findings(bigint, jsonb),
    coordinator._declare(text, jsonb),
    coordinator._alert_open(bigint, text, bigint, timestamptz, interval)
  TO coordinator_daemon;

-- Retention (0013) is the daemon's and the operators' (`coordinator prune`, which needs a
-- role that is not confined: it deletes across namespaces).
REVOKE EXECUTE ON FUNCTION
    coordinator._prunable(bigint, bigint, integer, timestamptz, boolean, integer),
    coordinator._prune(bigint, bigint, integer, integer, timestamptz, interval, integer),
    coordinator._prune_preview(timestamptz, interval, integer)
  FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    coordinator._prunable(bigint, bigint, integer, timestamptz, boolean, integer),
    coordinator._prune(bigint, bigint, integer, integer, timestamptz, interval, integer),
    coordinator._prune_preview(timestamptz, interval, integer)
  TO coordinator_daemon, coordinator_admin;
