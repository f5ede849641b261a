-- The SQL API's small refusals said as the others are, and a run restarted from scratch
-- that no longer reads as resumed (an application developer's report, 2026-12-03).
--
-- 1. resolve(): an outcome it does not know was refused as `outcome must be failed,
--    succeeded or retry, not maybe`, without the `argument: ` prefix and COLUMN that
--    every other argument's refusal has (0026). Now `outcome: must be failed, succeeded
--    or retry, not 'maybe'` (22023, COLUMN outcome), in define_job's shape.
-- 2. trigger(): args that are not an object said `args must be a JSON object`; now
--    `args: must be a JSON object, not array`, as define_job says of params.
-- 3. A confined role's trigger() (pause, resume, remove, ...) of a namespace no job can
--    have ('Bad NS!') was refused as `permission denied for namespace "Bad NS!"`, its
--    DETAIL suggesting `coordinator grant ROLE Bad NS!`, which `grant` refuses. No grant
--    can exist for such a name: _require_namespace now says the name's problem instead,
--    in the words define_job and sync use (22023, COLUMN namespace). It is reached only
--    when _may() says no, so a role that may operate the namespace pays nothing.
-- 4. cancel() by a role that may only read the run's namespace answered with the run's
--    state (`run 1 is succeeded, only queued or paused runs can be cancelled`), and was
--    refused only when the state allowed the write (by the runs guard). It is now
--    refused on permission first (42501, the guard's words and DETAIL), before any row
--    lock; so are resolve() and pause_run(), which had the same order. A run of a
--    namespace the role cannot read is still unknown.
-- 5. define_job() (and so sync()) stored a command job's params of any size, though a
--    command gets them in one environment variable, COORDINATOR_PARAMS, which holds
--    128 KiB at most (Linux's MAX_ARG_STRLEN, model.ENV_STRING_MAX, counting the name,
--    '=' and the NUL): every run then failed. The CLI, the Python client, manifests and
--    workers refuse them at definition (client._prepare); now SQL does, in the same words
--    and by the same measure: the params as JSON text, non-ASCII as UTF-8 (jsonb's text
--    is the JSON the daemon passes on, model.params_env: the same separators, escapes
--    and key order). Like the client, only for a command target stored valid (no
--    invalid_reason). A job stored before keeps its params; its redefinition is refused.
-- 6. A paused run of a job redefined without `recoverable` (or a recoverable job's
--    retry, carrying the failed attempt's cursor, when the job is no longer
--    recoverable) runs from scratch when claimed: the worker executor hands no cursor
--    and no counter to a job that is not recoverable. The claim still counted it a
--    resume and kept its old cursor, counter, progress, finding counts and findings, so
--    `runs show` read as a resume from that cursor, under the old handler's findings.
--    The claim decides it (it reads the job as locked, and counts resumes): such a run
--    is now reset to a run never started before it is promoted (no start, cursor,
--    counter, progress, checkpoint time, finding counts; its findings deleted), so it
--    starts now with no resume counted, and a give-back treats it as a run that never
--    started. Only those runs pay: a queued run that started before or carries a cursor
--    (a trigger's resume), or a paused run resumed by its job's tick, of a job that is
--    not recoverable: an UPDATE by the run's key and a DELETE of its findings by
--    findings_by_run (in _claim_many one statement for the batch), never for a plain
--    claim. _claim_many decides it for the batch in the SELECT that decides every item
--    (two more columns and two aggregates).
--
-- Redefined, each from its latest definition and with its SET clauses as they are now
-- (enable_seqscan = off since 0004, jit = off since 0035, plan_cache_mode for
-- _claim_many since 0021, STABLE for _require_namespace): resolve, cancel (0016),
-- trigger (0029), _require_namespace (0014), pause_run (0012), define_job (0031),
-- _claim, _claim_many (0024). CREATE OR REPLACE with the same signatures: their grants
-- (_claim and _claim_many: not PUBLIC's, coordinator_daemon's) stay as they are.

-- ---------------------------------------------------------------------------------------
-- 1, 4. resolve(): the outcome's refusal named; permission before the run's state.
-- ---------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION coordinator.resolve(run_id bigint, outcome text) RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
#variable_conflict use_variable
DECLARE
    r      coordinator.runs;
    new_id bigint;
    ns     text;
BEGIN
    IF run_id IS NULL OR outcome IS NULL THEN
        PERFORM coordinator._require(run_id, 'run_id');
        PERFORM coordinator._require(outcome, 'outcome');
    END IF;
    IF outcome NOT IN ('failed', 'succeeded', 'retry') THEN
        RAISE EXCEPTION 'outcome: must be failed, succeeded or retry, not %',
                        quote_literal(outcome)
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'outcome';
    END IF;
    -- Whether the caller may write here, before the run's state is asked (and before any
    -- lock): a read-only role is refused as such, whatever state the run is in. (A run of
    -- a namespace it cannot read is not found: unknown, below.)
    SELECT j.namespace INTO ns FROM coordinator.jobs j
     WHERE j.id = (SELECT x.job_id FROM coordinator.runs x WHERE x.id = run_id);
    IF ns IS NOT NULL AND NOT coordinator._may(ns, true) THEN
        PERFORM coordinator._require_namespace(ns, true);
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

-- ---------------------------------------------------------------------------------------
-- 4. cancel() and pause_run(): permission before the run's state.
-- ---------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION coordinator.cancel(run_id bigint) RETURNS void
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
#variable_conflict use_variable
DECLARE
    r  coordinator.runs;
    ns text;
BEGIN
    PERFORM coordinator._require(run_id, 'run_id');
    -- Whether the caller may write here, before the run's state is asked (as resolve).
    SELECT j.namespace INTO ns FROM coordinator.jobs j
     WHERE j.id = (SELECT x.job_id FROM coordinator.runs x WHERE x.id = run_id);
    IF ns IS NOT NULL AND NOT coordinator._may(ns, true) THEN
        PERFORM coordinator._require_namespace(ns, true);
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

CREATE OR REPLACE FUNCTION coordinator.pause_run(run_id bigint) RETURNS text
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
#variable_conflict use_variable
DECLARE
    r               coordinator.runs;
    j               coordinator.jobs;
    ns              text;
    previous_origin text := current_setting('coordinator.origin', true);
BEGIN
    PERFORM coordinator._require(run_id, 'run_id');
    -- Whether the caller may write here, before the run's state is asked (as resolve):
    -- a read-only role was answered 'paused' for a paused run, refused for a running one.
    SELECT jj.namespace INTO ns FROM coordinator.jobs jj
     WHERE jj.id = (SELECT x.job_id FROM coordinator.runs x WHERE x.id = run_id);
    IF ns IS NOT NULL AND NOT coordinator._may(ns, true) THEN
        PERFORM coordinator._require_namespace(ns, true);
    END IF;
    SELECT * INTO r FROM coordinator.runs WHERE id = run_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown run %', run_id
            USING ERRCODE = 'no_data_found', HINT = 'coordinator.run_not_found';
    END IF;
    IF r.status IN ('cancel_requested', 'paused') THEN
        RETURN r.status;
    END IF;
    SELECT * INTO j FROM coordinator.jobs WHERE id = r.job_id;
    IF NOT j.recoverable THEN
        RAISE EXCEPTION 'run % of %/% cannot be paused: the job is not recoverable '
                        '(define it with recoverable)', run_id, j.namespace, j.name
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF r.status IN ('running', 'pending') THEN
        -- The pause payload replaces the runs trigger's wake: the daemon needs no refresh.
        PERFORM set_config('coordinator.origin', 'quiet', true);
        UPDATE coordinator.runs SET status = 'cancel_requested' WHERE id = run_id;
        PERFORM set_config('coordinator.origin', coalesce(previous_origin, ''), true);
        IF NOT coordinator._wakes_suppressed() THEN
            PERFORM pg_notify('coordinator', json_build_object('pause', run_id)::text);
        END IF;
        RETURN 'cancel_requested';
    ELSIF r.status = 'queued' THEN
        UPDATE coordinator.runs
           SET status = 'paused', paused_at = now(),
               error_message = 'paused by operator before it started'
         WHERE id = run_id;
        RETURN 'paused';
    END IF;
    RAISE EXCEPTION 'run % is %: only a running or queued run can be paused', run_id, r.status
        USING ERRCODE = 'object_not_in_prerequisite_state';
END
$$;

-- ---------------------------------------------------------------------------------------
-- 3. A namespace no grant can name is refused as such.
-- ---------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION coordinator._require_namespace(p_namespace text, p_operate boolean)
RETURNS void
LANGUAGE plpgsql STABLE SET enable_seqscan = off SET jit = off AS $$
DECLARE
    problem text;
BEGIN
    IF p_namespace IS NULL OR coordinator._may(p_namespace, p_operate) THEN
        RETURN;
    END IF;
    -- No job can be in it and `coordinator grant` refuses it: not a grant to suggest.
    problem := coordinator._namespace_problem(p_namespace);
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION '%', problem
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'namespace';
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
-- 2. trigger(): args that are not an object, in define_job's words for params.
-- ---------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION coordinator.trigger(namespace text, name text, args jsonb DEFAULT '{}')
RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
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
        RAISE EXCEPTION 'args: must be a JSON object, not %', jsonb_typeof(args)
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

-- ---------------------------------------------------------------------------------------
-- 5. define_job(): a command job's params that no environment variable can hold.
-- ---------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION coordinator.define_job(
    name            text,
    schedule_kind   text,
    target          jsonb,
    schedule        text DEFAULT NULL,
    namespace       text DEFAULT 'default',
    timezone        text DEFAULT 'UTC',
    params          jsonb DEFAULT '{}',
    timeout         interval DEFAULT NULL,
    priority        text DEFAULT 'background',
    idempotent      boolean DEFAULT false,
    paused          boolean DEFAULT NULL,
    invalid_reason  text DEFAULT NULL,
    retries         integer DEFAULT 0,
    retry_backoff   interval DEFAULT '30 seconds',
    retry_max_delay interval DEFAULT '1 hour',
    misfire         text DEFAULT 'run-once',
    misfire_grace   interval DEFAULT NULL,
    recoverable     boolean DEFAULT false,
    alert           boolean DEFAULT true,
    keep_last       integer DEFAULT NULL,
    retention       interval DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
#variable_conflict use_variable
DECLARE
    problem text := coordinator._namespace_problem(namespace);
BEGIN
    -- The namespace first, as sync() and trigger() check it: refused here, the refusal
    -- is one line; refused by the row security of _define_job's INSERT, its CONTEXT
    -- quoted the whole dynamic INSERT ... ON CONFLICT statement (about 40 lines).
    IF namespace IS NOT NULL THEN
        IF problem IS NOT NULL THEN
            RAISE EXCEPTION '%', problem
                USING ERRCODE = 'invalid_parameter_value', COLUMN = 'namespace';
        END IF;
        IF NOT coordinator._may(namespace, true) THEN
            PERFORM coordinator._require_namespace(namespace, true);
        END IF;
    END IF;
    -- The name next, in the same words: refused by the jobs table's check trigger, the
    -- refusal was 23514 with a CONTEXT quoting the whole INSERT ... ON CONFLICT.
    IF name IS NOT NULL AND coordinator._name_problem(name) IS NOT NULL THEN
        RAISE EXCEPTION '%', coordinator._name_problem(name)
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'name';
    END IF;
    IF schedule_kind NOT IN ('cron', 'interval', 'once', 'manual') THEN
        RAISE EXCEPTION 'schedule_kind: must be cron, interval, once or manual, not %',
                        quote_literal(schedule_kind)
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'schedule_kind';
    END IF;
    IF schedule_kind = 'manual' AND schedule IS NOT NULL THEN
        RAISE EXCEPTION 'schedule: a manual job has none (it runs when triggered), not %',
                        quote_literal(schedule)
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'schedule';
    ELSIF schedule_kind <> 'manual' AND schedule IS NULL THEN
        RAISE EXCEPTION 'schedule: required for a % job', schedule_kind
            USING ERRCODE = 'null_value_not_allowed', COLUMN = 'schedule';
    END IF;
    IF priority NOT IN ('interactive', 'background') THEN
        RAISE EXCEPTION 'priority: must be interactive or background, not %',
                        quote_literal(priority)
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'priority';
    END IF;
    IF jsonb_typeof(params) <> 'object' THEN
        RAISE EXCEPTION 'params: must be a JSON object, not %', jsonb_typeof(params)
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'params';
    END IF;
    -- A command gets its params in one environment string, COORDINATOR_PARAMS=<JSON> and
    -- its NUL, of at most 128 KiB (model.ENV_STRING_MAX): the client's rule and words.
    IF invalid_reason IS NULL AND target->>'kind' = 'exec'
       AND octet_length(params::text) > 131072 - octet_length('COORDINATOR_PARAMS=') - 1 THEN
        RAISE EXCEPTION 'params: % bytes as JSON; a command gets its params in one environment '
                        'variable (COORDINATOR_PARAMS), which may hold 128 KiB at most: pass '
                        'large input as a run''s args (its stdin), or a reference to it (a '
                        'path, a key)', to_char(octet_length(params::text), 'FM999,999,999,990')
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'params';
    END IF;
    -- Zero, negative or finer than a microsecond: out of bounds, not a non-duration.
    IF schedule_kind = 'interval' AND invalid_reason IS NULL
       AND coordinator._duration_us(schedule) IS NULL
       AND coordinator._duration_sign_problem(schedule) IS NOT NULL THEN
        RAISE EXCEPTION '%', coordinator._interval_problem(schedule)
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'every';
    END IF;
    RETURN coordinator._define_job(name, schedule_kind, target, schedule, namespace, timezone,
                                   params, timeout, priority, idempotent, paused,
                                   invalid_reason, retries, retry_backoff, retry_max_delay,
                                   misfire, misfire_grace, recoverable, alert, keep_last,
                                   retention);
END
$$;

-- ---------------------------------------------------------------------------------------
-- 6. The claim: a run whose job is no longer recoverable starts as one never started.
-- ---------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION coordinator._claim(
    p_job_id        bigint,
    p_run_id        bigint,       -- the queued run of a manual or retry dispatch, NULL for a deadline
    p_scheduled_for timestamptz,  -- the armed deadline (scheduled), or the armed due time (retry)
    p_version       integer,      -- schedule_version the deadline was armed for
    p_instance      text,
    p_workers       text[],       -- worker types currently served
    p_leader_pid    integer,      -- backend pid holding the single-writer lock, or NULL
    p_lock_class    integer,
    p_lock_obj      integer,
    p_now           timestamptz DEFAULT NULL,  -- the daemon's clock (NULL: no misfire)
    p_skip_next     timestamptz DEFAULT NULL,  -- the deadline after p_now (saved if misfired)
    OUT reason           text,
    OUT run_id           bigint,
    OUT trigger          text,
    OUT args             jsonb,
    OUT attempt          integer,
    OUT scheduled_for    timestamptz,
    OUT claimed_at       timestamptz,
    OUT namespace        text,
    OUT name             text,
    OUT schedule_kind    text,
    OUT schedule         text,
    OUT timezone         text,
    OUT target           jsonb,
    OUT params           jsonb,
    OUT timeout          interval,
    OUT priority         text,
    OUT idempotent       boolean,
    OUT schedule_version integer,
    OUT next_run_at      timestamptz,
    OUT retries          integer,
    OUT retry_backoff    interval,
    OUT retry_max_delay  interval,
    OUT misfire          text,
    OUT misfire_grace    interval,
    OUT recoverable      boolean,
    OUT cursor           jsonb,
    OUT count            bigint,
    OUT resumes          integer
)
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
DECLARE
    j coordinator.jobs;
    r coordinator.runs;
BEGIN
    IF p_leader_pid IS NOT NULL THEN
        -- The fence, held until this claim commits (0018): a takeover's sweep waits for
        -- it, so a run claimed here is either seen by that sweep or never claimed.
        PERFORM pg_advisory_xact_lock_shared(p_lock_class, p_lock_obj + 1);
        -- The leader's session holds (class, -its pid) while it leads (0020): a probe of
        -- that lock is the whole check. Only when the probe finds nobody there (the
        -- session is gone, or a daemon older than 0020 leads) is pg_locks read.
        IF pg_try_advisory_xact_lock_shared(p_lock_class, -p_leader_pid) THEN
            IF NOT EXISTS (
                SELECT 1 FROM pg_locks l
                 WHERE l.locktype = 'advisory' AND l.pid = p_leader_pid AND l.granted
                   AND l.classid = p_lock_class::oid AND l.objid = p_lock_obj::oid
                   AND l.objsubid = 2
            ) THEN
                reason := 'fenced';
                RETURN;
            END IF;
        END IF;
    END IF;

    SELECT * INTO j FROM coordinator.jobs WHERE id = p_job_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        reason := 'gone';
        RETURN;
    END IF;

    IF p_run_id IS NOT NULL THEN
        SELECT * INTO r FROM coordinator.runs WHERE id = p_run_id AND job_id = p_job_id FOR UPDATE;
        IF NOT FOUND THEN
            reason := 'gone';
            RETURN;
        ELSIF r.status <> 'queued' THEN
            reason := 'not_queued';
            RETURN;
        END IF;
    END IF;

    IF j.paused THEN
        reason := 'paused';
    ELSIF j.invalid_reason IS NOT NULL THEN
        reason := 'invalid';
    ELSIF p_run_id IS NOT NULL AND r.due_at > coalesce(p_scheduled_for, p_now, now()) THEN
        reason := 'not_due';
    ELSIF p_run_id IS NULL AND j.schedule_version <> p_version THEN
        reason := 'version';
    ELSIF p_run_id IS NULL AND j.next_run_at IS DISTINCT FROM p_scheduled_for THEN
        -- (Not compared with now(): the daemon's clock decided the deadline is due, and a
        -- database clock a little behind must not refuse it.)
        reason := 'deadline';
    ELSIF p_run_id IS NULL AND j.misfire = 'skip' AND p_now - p_scheduled_for > j.misfire_grace THEN
        UPDATE coordinator.jobs SET next_run_at = p_skip_next, updated_at = now()
         WHERE id = j.id;
        reason := 'misfire';
        scheduled_for := p_scheduled_for;
        schedule_version := j.schedule_version;
        next_run_at := p_skip_next;
        RETURN;
    ELSIF j.target->>'kind' = 'worker'
          AND NOT ((j.target->>'type') = ANY (coalesce(p_workers, '{}'))) THEN
        reason := 'unavailable';
    END IF;
    IF reason IS NOT NULL THEN
        RETURN;
    END IF;

    IF p_run_id IS NOT NULL THEN
        IF NOT j.recoverable AND (r.started_at IS NOT NULL OR r.cursor IS NOT NULL) THEN
            -- Its job is no longer recoverable: it runs from scratch, as a run never
            -- started (6).
            DELETE FROM coordinator.findings f WHERE f.run_id = p_run_id;
            UPDATE coordinator.runs
               SET started_at = NULL, resumes = 0, cursor = NULL, count = NULL,
                   progress = NULL, last_progress_at = NULL, finding_counts = NULL
             WHERE id = p_run_id;
        END IF;
        -- A queued run that started before is a resume (a trigger of a paused run): it
        -- keeps its first start.
        UPDATE coordinator.runs
           SET status = 'running', claimed_at = now(), started_at = coalesce(started_at, now()),
               instance = p_instance, schedule_version = j.schedule_version,
               resumes = runs.resumes + CASE WHEN runs.started_at IS NULL THEN 0 ELSE 1 END,
               paused_at = NULL, error_cause = NULL, error_message = NULL
         WHERE id = p_run_id
        RETURNING * INTO r;
    ELSE
        SELECT * INTO r FROM coordinator.runs
         WHERE job_id = j.id AND status = 'paused' FOR UPDATE;
        IF FOUND THEN
            IF NOT j.recoverable THEN
                -- Its job is no longer recoverable: it runs from scratch (6).
                DELETE FROM coordinator.findings f WHERE f.run_id = r.id;
                UPDATE coordinator.runs
                   SET started_at = NULL, resumes = 0, cursor = NULL, count = NULL,
                       progress = NULL, last_progress_at = NULL, finding_counts = NULL
                 WHERE id = r.id;
            END IF;
            -- The tick resumes the paused run; it serves this deadline now.
            UPDATE coordinator.runs
               SET status = 'running', claimed_at = now(), instance = p_instance,
                   started_at = coalesce(runs.started_at, now()),
                   schedule_version = j.schedule_version, scheduled_for = p_scheduled_for,
                   resumes = runs.resumes
                             + CASE WHEN runs.started_at IS NULL THEN 0 ELSE 1 END,
                   paused_at = NULL, error_cause = NULL, error_message = NULL
             WHERE id = r.id
            RETURNING * INTO r;
        ELSE
            INSERT INTO coordinator.runs (job_id, trigger, status, scheduled_for, claimed_at,
                                          started_at, schedule_version, instance)
            VALUES (j.id, 'schedule', 'running', p_scheduled_for, now(), now(),
                    j.schedule_version, p_instance)
            ON CONFLICT (job_id)
               WHERE status IN ('queued', 'pending', 'running', 'unresolved', 'cancel_requested',
                                'paused')
            DO NOTHING
            RETURNING * INTO r;
            IF r.id IS NULL THEN
                reason := 'outstanding';
                RETURN;
            END IF;
        END IF;
    END IF;

    run_id := r.id;
    trigger := r.trigger;
    args := r.args;
    attempt := r.attempt;
    scheduled_for := r.scheduled_for;
    claimed_at := r.claimed_at;
    namespace := j.namespace;
    name := j.name;
    schedule_kind := j.schedule_kind;
    schedule := j.schedule;
    timezone := j.timezone;
    target := j.target;
    params := j.params;
    timeout := j.timeout;
    priority := j.priority;
    idempotent := j.idempotent;
    schedule_version := j.schedule_version;
    next_run_at := j.next_run_at;
    retries := j.retries;
    retry_backoff := j.retry_backoff;
    retry_max_delay := j.retry_max_delay;
    misfire := j.misfire;
    misfire_grace := j.misfire_grace;
    recoverable := j.recoverable;
    cursor := r.cursor;
    count := r.count;
    resumes := r.resumes;
END
$$;

CREATE OR REPLACE FUNCTION coordinator._claim_many(
    p_items      text,      -- [{"i": index, "job": id, "run": id|null, "at": ts|null, "v": n|null,
                            --   "now": ts, "skip": ts|null}]
    p_instance   text,
    p_workers    text[],
    p_leader_pid integer,
    p_lock_class integer,
    p_lock_obj   integer
) RETURNS TABLE (
    i                integer,
    err_state        text,
    err_message      text,
    reason           text,
    run_id           bigint,
    trigger          text,
    args             jsonb,
    attempt          integer,
    scheduled_for    timestamptz,
    claimed_at       timestamptz,
    namespace        text,
    name             text,
    schedule_kind    text,
    schedule         text,
    timezone         text,
    target           jsonb,
    params           jsonb,
    timeout          interval,
    priority         text,
    idempotent       boolean,
    schedule_version integer,
    next_run_at      timestamptz,
    retries          integer,
    retry_backoff    interval,
    retry_max_delay  interval,
    misfire          text,
    misfire_grace    interval,
    recoverable      boolean,
    cursor           jsonb,
    count            bigint,
    resumes          integer
)
LANGUAGE plpgsql SET enable_seqscan = off SET plan_cache_mode = force_generic_plan
SET jit = off AS $$
-- (OUT columns share names with table columns: in SQL here names mean the columns.)
#variable_conflict use_column
DECLARE
    items    json := p_items::json;
    -- The items, one array per field, in job id order (the order rows are locked in).
    a_i      integer[];
    a_job    bigint[];
    a_run    bigint[];
    a_at     timestamptz[];
    a_v      integer[];
    a_now    timestamptz[];
    a_skip   timestamptz[];
    a_why    text[];                 -- each item's refusal (NULL: granted)
    n_items  integer;
    n_jobs   integer;
    n_twice  integer;                -- runs named by more than one item
    locked   coordinator.jobs[];     -- the jobs as locked
    queued   coordinator.runs[];     -- the items' queued runs as locked
    claimed  coordinator.runs[] := '{}';
    more     coordinator.runs[];
    -- What to write: misfired deadlines (job, the deadline saved in its place); queued
    -- runs to promote (run, its job's schedule version); paused runs to resume and new
    -- runs to insert (job, deadline, schedule version).
    m_job    bigint[];
    m_skip   timestamptz[];
    p_run    bigint[];
    p_ver    integer[];
    r_job    bigint[];
    r_at     timestamptz[];
    r_ver    integer[];
    n_job    bigint[];
    n_at     timestamptz[];
    n_ver    integer[];
    -- Runs that run from scratch, their job no longer recoverable (6): queued runs that
    -- started before or carry a cursor, and the jobs whose paused run a tick resumes.
    s_run    bigint[];
    s_job    bigint[];
BEGIN
    -- Fencing once for the batch (each item would otherwise scan pg_locks again), under
    -- the fence held until the batch commits (0018; see coordinator._claim).
    IF p_leader_pid IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock_shared(p_lock_class, p_lock_obj + 1);
    END IF;
    IF p_leader_pid IS NOT NULL
       -- (CASE: the probe first, pg_locks only when it finds nobody; as in _claim.)
       AND (CASE WHEN pg_try_advisory_xact_lock_shared(p_lock_class, -p_leader_pid)
                 THEN NOT EXISTS (
                     SELECT 1 FROM pg_locks l
                      WHERE l.locktype = 'advisory' AND l.pid = p_leader_pid AND l.granted
                        AND l.classid = p_lock_class::oid AND l.objid = p_lock_obj::oid
                        AND l.objsubid = 2)
                 ELSE false END)
    THEN
        RETURN QUERY SELECT x.i, NULL::text, NULL::text, 'fenced'::text, NULL::bigint,
                            NULL::text, NULL::jsonb, NULL::integer, NULL::timestamptz,
                            NULL::timestamptz, NULL::text, NULL::text, NULL::text, NULL::text,
                            NULL::text, NULL::jsonb, NULL::jsonb, NULL::interval, NULL::text,
                            NULL::boolean, NULL::integer, NULL::timestamptz,
                            NULL::integer, NULL::interval, NULL::interval, NULL::text,
                            NULL::interval, NULL::boolean, NULL::jsonb, NULL::bigint,
                            NULL::integer
                       FROM json_to_recordset(items) AS x(i integer);
        RETURN;
    END IF;

    -- (In the order they came: the rows are locked below in job id order whatever
    -- this order is, and the answer is sorted at the end.)
    SELECT array_agg(x.i), array_agg(x.job), array_agg(x.run), array_agg(x.at),
           array_agg(x.v), array_agg(x.now), array_agg(x.skip), count(*), count(DISTINCT x.job),
           count(x.run) - count(DISTINCT x.run)
      INTO a_i, a_job, a_run, a_at, a_v, a_now, a_skip, n_items, n_jobs, n_twice
      FROM json_to_recordset(items)
           AS x(i integer, job bigint, run bigint, at timestamptz, v integer,
                now timestamptz, skip timestamptz);
    IF n_items = 0 THEN
        RETURN;
    END IF;

    -- Optimistically, the whole batch in one go; if any item fails, the batch is rolled
    -- back to here and done again item by item, each in a subtransaction of its own
    -- (a subtransaction per item costs more than the batch: only pay it when needed).
    BEGIN
        IF n_items = 1 OR n_jobs < n_items OR n_twice > 0 THEN
            -- One item (a lone trigger on an idle daemon: the set-based statements' fixed
            -- cost, ~2 ms, would be its latency), two items of one job or run (the second
            -- sees what the first did), or an item without a job: item by item, as before.
            RETURN QUERY SELECT * FROM coordinator._claim_each(items, p_instance, p_workers,
                                                               false);
            RETURN;
        END IF;

        -- The jobs' row locks, in job id order; then the queued runs' (each only if it is
        -- its item's job's, as _claim locks it). Both read as locked.
        SELECT coalesce(array_agg(s.j), '{}') INTO locked
          FROM (SELECT j FROM coordinator.jobs j WHERE j.id = ANY (a_job) ORDER BY j.id
                   FOR NO KEY UPDATE OF j) s;
        IF cardinality(array_remove(a_run, NULL)) > 0 THEN
            SELECT coalesce(array_agg(s.r), '{}') INTO queued
              FROM (SELECT r FROM coordinator.runs r
                     WHERE r.id = ANY (a_run)
                       AND r.job_id = a_job[array_position(a_run, r.id)]
                     ORDER BY r.id FOR UPDATE OF r) s;
        ELSE
            queued := '{}';
        END IF;

        -- Each item's outcome, as _claim decides it, from the rows as locked; and what to
        -- write for it.
        SELECT array_agg(d.why ORDER BY d.o),
               array_agg(d.job) FILTER (WHERE d.why = 'misfire'),
               array_agg(d.skip) FILTER (WHERE d.why = 'misfire'),
               array_agg(d.run) FILTER (WHERE d.why IS NULL AND d.run IS NOT NULL),
               array_agg(d.ver) FILTER (WHERE d.why IS NULL AND d.run IS NOT NULL),
               array_agg(d.job) FILTER (WHERE d.why IS NULL AND d.run IS NULL AND d.held),
               array_agg(d.at) FILTER (WHERE d.why IS NULL AND d.run IS NULL AND d.held),
               array_agg(d.ver) FILTER (WHERE d.why IS NULL AND d.run IS NULL AND d.held),
               array_agg(d.job) FILTER (WHERE d.why IS NULL AND d.run IS NULL AND NOT d.held),
               array_agg(d.at) FILTER (WHERE d.why IS NULL AND d.run IS NULL AND NOT d.held),
               array_agg(d.ver) FILTER (WHERE d.why IS NULL AND d.run IS NULL AND NOT d.held),
               array_agg(d.run) FILTER (WHERE d.why IS NULL AND d.run IS NOT NULL AND d.scratch),
               array_agg(d.job) FILTER (WHERE d.why IS NULL AND d.run IS NULL AND d.held
                                          AND NOT d.recoverable)
          INTO a_why, m_job, m_skip, p_run, p_ver, r_job, r_at, r_ver, n_job, n_at, n_ver,
               s_run, s_job
          FROM (
            SELECT x.o, x.job, x.run, x.at, x.skip, j.schedule_version AS ver,
                   j.recoverable,
                   NOT j.recoverable AND (r.started_at IS NOT NULL OR r.cursor IS NOT NULL)
                       AS scratch,
                   CASE
                       WHEN j.id IS NULL THEN 'gone'
                       WHEN x.run IS NOT NULL AND r.id IS NULL THEN 'gone'
                       WHEN x.run IS NOT NULL AND r.status <> 'queued' THEN 'not_queued'
                       WHEN j.paused THEN 'paused'
                       WHEN j.invalid_reason IS NOT NULL THEN 'invalid'
                       WHEN x.run IS NOT NULL
                            AND r.due_at > coalesce(x.at, x.now, now()) THEN 'not_due'
                       WHEN x.run IS NULL AND j.schedule_version <> x.v THEN 'version'
                       -- (Not compared with now(): the daemon's clock decided the
                       -- deadline is due, and a database clock a little behind must not
                       -- refuse it.)
                       WHEN x.run IS NULL AND j.next_run_at IS DISTINCT FROM x.at THEN 'deadline'
                       WHEN x.run IS NULL AND j.misfire = 'skip'
                            AND x.now - x.at > j.misfire_grace THEN 'misfire'
                       WHEN j.target->>'kind' = 'worker'
                            AND NOT ((j.target->>'type') = ANY (coalesce(p_workers, '{}')))
                            THEN 'unavailable'
                   END AS why,
                   -- A deadline of a job whose run is paused resumes that run.
                   x.run IS NULL AND j.id IS NOT NULL AND EXISTS (
                       SELECT 1 FROM coordinator.runs p
                        WHERE p.job_id = x.job AND p.status = 'paused') AS held
              FROM unnest(a_job, a_run, a_at, a_v, a_now, a_skip) WITH ORDINALITY
                   AS x(job, run, at, v, now, skip, o)
              LEFT JOIN unnest(locked) AS j ON j.id = x.job
              LEFT JOIN unnest(queued) AS r ON r.id = x.run AND r.job_id = x.job
            -- (OFFSET 0: each item's outcome computed once, not once per aggregate.)
            OFFSET 0
          ) d;

        -- A misfired deadline: the one after the daemon's clock is saved in its place.
        IF m_job IS NOT NULL THEN
            UPDATE coordinator.jobs
               SET next_run_at = m_skip[array_position(m_job, jobs.id)], updated_at = now()
             WHERE jobs.id = ANY (m_job);
        END IF;

        -- Runs that run from scratch (6): made runs never started, then promoted or
        -- resumed below as such. (A paused run cancelled meanwhile is not one: the
        -- resume below gives way to a new run, as _claim finds no paused run.)
        IF s_run IS NOT NULL OR s_job IS NOT NULL THEN
            WITH s AS (
                UPDATE coordinator.runs
                   SET started_at = NULL, resumes = 0, cursor = NULL, count = NULL,
                       progress = NULL, last_progress_at = NULL, finding_counts = NULL
                 WHERE runs.id = ANY (coalesce(s_run, '{}'))
                    OR (runs.job_id = ANY (coalesce(s_job, '{}')) AND runs.status = 'paused')
                RETURNING runs.id
            )
            DELETE FROM coordinator.findings f USING s WHERE f.run_id = s.id;
        END IF;

        -- Queued manual and retry runs: promoted. (A queued run that started before is a
        -- resume, a trigger of a paused run: it keeps its first start.)
        IF p_run IS NOT NULL THEN
            WITH u AS (
                UPDATE coordinator.runs
                   SET status = 'running', claimed_at = now(),
                       started_at = coalesce(runs.started_at, now()),
                       instance = p_instance,
                       schedule_version = p_ver[array_position(p_run, runs.id)],
                       resumes = runs.resumes
                                 + CASE WHEN runs.started_at IS NULL THEN 0 ELSE 1 END,
                       paused_at = NULL, error_cause = NULL, error_message = NULL
                 WHERE runs.id = ANY (p_run)
                RETURNING runs
            )
            SELECT claimed || coalesce(array_agg(u.runs), '{}') INTO claimed FROM u;
        END IF;

        -- Deadlines of jobs whose run is paused: the tick resumes it; it serves this
        -- deadline now.
        IF r_job IS NOT NULL THEN
            WITH u AS (
                UPDATE coordinator.runs
                   SET status = 'running', claimed_at = now(), instance = p_instance,
                       started_at = coalesce(runs.started_at, now()),
                       schedule_version = r_ver[array_position(r_job, runs.job_id)],
                       scheduled_for = r_at[array_position(r_job, runs.job_id)],
                       resumes = runs.resumes
                                 + CASE WHEN runs.started_at IS NULL THEN 0 ELSE 1 END,
                       paused_at = NULL, error_cause = NULL, error_message = NULL
                 WHERE runs.job_id = ANY (r_job) AND runs.status = 'paused'
                RETURNING runs
            )
            SELECT coalesce(array_agg(u.runs), '{}') INTO more FROM u;
            claimed := claimed || more;
            IF cardinality(more) < cardinality(r_job) THEN
                -- A paused run changed meanwhile (cancelled, say): a new run instead, as
                -- _claim would find no paused run and insert one.
                SELECT n_job || array_agg(x.job), n_at || array_agg(x.at),
                       n_ver || array_agg(x.ver)
                  INTO n_job, n_at, n_ver
                  FROM unnest(r_job, r_at, r_ver) AS x(job, at, ver)
                 WHERE NOT EXISTS (SELECT 1 FROM unnest(more) AS m WHERE m.job_id = x.job);
            END IF;
        END IF;

        -- Other deadlines: a new run, unless one is outstanding (the partial unique index
        -- decides, whatever races).
        IF n_job IS NOT NULL THEN
            WITH u AS (
                INSERT INTO coordinator.runs AS n (job_id, trigger, status, scheduled_for,
                                                   claimed_at, started_at, schedule_version,
                                                   instance)
                SELECT x.job, 'schedule', 'running', x.at, now(), now(), x.ver, p_instance
                  FROM unnest(n_job, n_at, n_ver) AS x(job, at, ver)
                 ORDER BY x.job
                ON CONFLICT (job_id)
                   WHERE status IN ('queued', 'pending', 'running', 'unresolved',
                                    'cancel_requested', 'paused')
                DO NOTHING
                RETURNING n
            )
            SELECT claimed || coalesce(array_agg(u.n), '{}') INTO claimed FROM u;
        END IF;

        RETURN QUERY
        SELECT x.i, NULL::text, NULL::text,
               CASE WHEN x.why IS NULL AND c.id IS NULL THEN 'outstanding' ELSE x.why END,
               c.id, c.trigger, c.args, c.attempt,
               CASE WHEN x.why = 'misfire' THEN x.at ELSE c.scheduled_for END,
               c.claimed_at,
               CASE WHEN c.id IS NOT NULL THEN j.namespace END,
               CASE WHEN c.id IS NOT NULL THEN j.name END,
               CASE WHEN c.id IS NOT NULL THEN j.schedule_kind END,
               CASE WHEN c.id IS NOT NULL THEN j.schedule END,
               CASE WHEN c.id IS NOT NULL THEN j.timezone END,
               CASE WHEN c.id IS NOT NULL THEN j.target END,
               CASE WHEN c.id IS NOT NULL THEN j.params END,
               CASE WHEN c.id IS NOT NULL THEN j.timeout END,
               CASE WHEN c.id IS NOT NULL THEN j.priority END,
               CASE WHEN c.id IS NOT NULL THEN j.idempotent END,
               CASE WHEN c.id IS NOT NULL OR x.why = 'misfire' THEN j.schedule_version END,
               CASE WHEN x.why = 'misfire' THEN x.skip
                    WHEN c.id IS NOT NULL THEN j.next_run_at END,
               CASE WHEN c.id IS NOT NULL THEN j.retries END,
               CASE WHEN c.id IS NOT NULL THEN j.retry_backoff END,
               CASE WHEN c.id IS NOT NULL THEN j.retry_max_delay END,
               CASE WHEN c.id IS NOT NULL THEN j.misfire END,
               CASE WHEN c.id IS NOT NULL THEN j.misfire_grace END,
               CASE WHEN c.id IS NOT NULL THEN j.recoverable END,
               c.cursor, c.count, c.resumes
          FROM unnest(a_i, a_job, a_at, a_skip, a_why) AS x(i, job, at, skip, why)
          LEFT JOIN unnest(claimed) AS c ON c.job_id = x.job
          LEFT JOIN unnest(locked) AS j ON j.id = x.job
         -- (The order of 0015: by job, then item.)
         ORDER BY x.job, x.i;
    EXCEPTION WHEN others THEN
        RETURN QUERY SELECT * FROM coordinator._claim_each(items, p_instance, p_workers, true);
    END;
END
$$;
