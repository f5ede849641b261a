-- Plans that survive statistics: every PL/pgSQL function of the schema runs with
-- enable_seqscan = off, so its statements reach rows through the indexes whatever the
-- table statistics said when the statements were planned.
--
-- The problem. PL/pgSQL caches a plan per statement per session; after five executions
-- it keeps the generic plan unless that looks dearer than the custom ones. When
-- autovacuum ANALYZEs coordinator.runs (or jobs) while it is still empty -- a young
-- installation -- pg_class.reltuples becomes 0 instead of -1 ("never counted", for which
-- the planner assumes at least 10 pages), so a session that runs these functions while
-- the tables are tiny plans every lookup as a sequential scan, rightly for one page, and
-- keeps that plan until the next ANALYZE of the table invalidates it. As the tables
-- fill, each call reads all of runs and jobs, several times. Reproduced by
-- tests/integration/test_stable_plans.py (ANALYZE of the empty tables, a warm-up on tiny
-- tables, then 150 jobs): per call, trigger() did 2 sequential scans of runs (its
-- outstanding-run lookup and the runs wake trigger's join) and 3 of jobs (the name
-- lookup, the foreign-key check of the new run, the wake's join); _claim() 2 of runs and
-- 1 of jobs; _settle() 2 of runs and 1-2 of jobs; cancel(), resolve(), pause(), resume(),
-- remove(), sync()/define_job() and _sweep_lost() likewise -- 0 with this file.
--
-- The choice, measured (3,000 trigger/_claim/_settle calls each in one statement,
-- server side, microseconds per call, on the 2-core bench machine; noisy to +-30%):
--
--                                   trigger   _claim   _settle   seq scans of runs
--   today, statistics never taken    68-105    67-107    53-64    0
--   today, ANALYZE while empty      260-800    70-75     56-61    2 per call, growing reads
--   SET plan_cache_mode =
--       force_custom_plan           200-320   130-230   120-165   some while runs is small
--   SET enable_seqscan = off         70-124    72-128    55-90    0
--
-- force_custom_plan plans every statement on every call (2-3x the server CPU of a cached
-- plan) and still follows the statistics; a rewrite of the lookups cannot help, since
-- the planner always weighs a sequential scan and prices it at nothing on a table it
-- believes empty. enable_seqscan = off keeps the cached plans and takes sequential scans
-- off the table for the statements of these functions only (each lookup here has an
-- index: runs_pkey, runs_one_outstanding_per_job, runs_by_job, jobs_pkey,
-- jobs_namespace_name_key; where none fits, the planner still scans). The setting also
-- covers what runs inside the call: the runs wake trigger and the foreign-key checks and
-- ON DELETE CASCADE of the runs this function writes. A SET clause costs about 1 us per
-- call (a GUC save and restore). The daemon's own statements outside these functions
-- (the full refresh, which should scan) are untouched.
--
-- ALTER FUNCTION ... SET changes nothing but the setting: bodies and signatures stay
-- those of 0001-0003. A later CREATE OR REPLACE FUNCTION of any of these (or a new
-- PL/pgSQL function in the schema) must repeat `SET enable_seqscan = off`: CREATE OR
-- REPLACE resets the function's settings to those it names, and
-- tests/integration/test_stable_plans.py checks every PL/pgSQL function of the schema.
-- (_wakes_suppressed() is plain SQL, reads no table and must stay inlinable: no SET.)

ALTER FUNCTION coordinator._jobs_wake() SET enable_seqscan = off;
ALTER FUNCTION coordinator._runs_wake() SET enable_seqscan = off;
ALTER FUNCTION coordinator._job_id(text, text, boolean) SET enable_seqscan = off;
ALTER FUNCTION coordinator.define_job(text, text, jsonb, text, text, text, jsonb, interval,
                                      text, boolean, boolean, text) SET enable_seqscan = off;
ALTER FUNCTION coordinator.trigger(text, text, jsonb) SET enable_seqscan = off;
ALTER FUNCTION coordinator.pause(text, text) SET enable_seqscan = off;
ALTER FUNCTION coordinator.resume(text, text) SET enable_seqscan = off;
ALTER FUNCTION coordinator.remove(text, text) SET enable_seqscan = off;
ALTER FUNCTION coordinator.sync(text, jsonb) SET enable_seqscan = off;
ALTER FUNCTION coordinator.resolve(bigint, text) SET enable_seqscan = off;
ALTER FUNCTION coordinator._claim(bigint, bigint, timestamptz, integer, text, text[], integer,
                                  integer, integer) SET enable_seqscan = off;
ALTER FUNCTION coordinator._settle(bigint, text, timestamptz, timestamptz, bigint, jsonb, text,
                                   text, integer, timestamptz) SET enable_seqscan = off;
ALTER FUNCTION coordinator._sweep_lost(text) SET enable_seqscan = off;
ALTER FUNCTION coordinator.cancel(bigint) SET enable_seqscan = off;
