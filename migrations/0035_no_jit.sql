-- No JIT compilation inside the schema's functions (a tester's finding, 2026-12-03).
--
-- Every PL/pgSQL function here runs with enable_seqscan = off (0004), so that plans
-- cached on tiny tables still reach rows through indexes. Where a statement has no usable
-- index (a small table read whole, such as namespace_grants), the planner still scans it
-- sequentially but prices that scan at disable_cost (1e10), far above jit_above_cost,
-- jit_inline_above_cost and jit_optimize_above_cost (1e5, 5e5, 5e5). On a cluster with
-- PostgreSQL's default jit = on, each such statement was then compiled, inlined and
-- optimized by LLVM before it ran: 50-120 ms for _namespaces(), which every statement of
-- an application role confined to its namespaces (0014) calls through the policies. A
-- confined define_job took ~200 ms, trigger ~470 ms, a sync of 50 jobs 17-31 s, and
-- concurrent syncs queued behind each other's row locks for minutes. The test clusters
-- (and the embedded one) run with jit = off, which hid it.
--
-- The statements in these functions are small by design (they reach rows by key); JIT
-- never pays off for them. Every function that sets enable_seqscan = off now also sets
-- jit = off. A later CREATE OR REPLACE of such a function replaces its settings: it must
-- repeat both (tests/integration/test_namespaces.py checks the catalog).

DO $no_jit$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace = 'coordinator'::regnamespace
           AND 'enable_seqscan=off' = ANY (p.proconfig)
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET jit = off', f);
    END LOOP;
END
$no_jit$;
