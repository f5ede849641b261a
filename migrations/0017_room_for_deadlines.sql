-- Room for deadlines (issue #14, cold start): every job's row is written again when its
-- deadline is saved -- all of them at once on a first start (a million rows at a
-- million jobs), one per settlement afterwards. Only next_run_at and updated_at change,
-- and neither is indexed, so PostgreSQL can write the new row version on the same page
-- without touching any index (a HOT update) -- if the page has room for it. At the
-- default fill factor (100) the pages of freshly inserted jobs have none: each write
-- then goes to another page and adds an entry to every index of the table, about twice
-- the work (measured on the development machine: first deadlines for 100,000 of a
-- million jobs, 1.3 s against 0.6 s server time; docs/scaling.md). Half of each page is
-- kept free, enough for every row to be rewritten once in place; the table takes about
-- twice the space (jobs are few and their rows small next to the runs).
--
-- Applies to pages written from now on (new jobs, and the whole table after a
-- VACUUM FULL); existing pages keep their layout.

ALTER TABLE coordinator.jobs SET (fillfactor = 50);
