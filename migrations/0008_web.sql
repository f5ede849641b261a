-- Run statistics for the admin web page and GET /api/jobs/{ns}/{name}/stats: counts of a
-- job's runs per outcome per time bucket, one aggregate (coordinator/client.py,
-- run_stats). This index lets it read only the runs inside the window, and only from
-- the index (status is included): a sparkline of the last 2 days of a job with a
-- million runs reads those 2 days, not the million. Runs are bucketed by created_at
-- (never NULL: when the run was queued or claimed).
--
-- Built inside the migration's transaction (no CONCURRENTLY): on a large runs table,
-- writes to runs wait while it builds (seconds per million rows).
CREATE INDEX runs_by_job_created ON coordinator.runs (job_id, created_at) INCLUDE (status);
