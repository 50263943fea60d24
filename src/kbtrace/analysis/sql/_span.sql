-- _span: the run's time extent (helper).
--
-- The replay clock starts at 0 ns. The makespan is run.json makespan_ns (it includes the
-- launch completion reaching the host after the last op) and never less than the end of
-- the last op.
--
-- Columns:
--   makespan_ns (ns)  max(run.json makespan_ns, max(op_timing.t_end_ns))
--   t_last_end_ns (ns) end of the last op
--   t_first_ns (ns)   earliest op issue time
--   n_ops (-)         replayed ops
CREATE OR REPLACE VIEW _span AS
SELECT greatest(max(t_end_ns), coalesce((SELECT makespan_ns FROM _run_meta), 0.0)) AS makespan_ns,
       max(t_end_ns) AS t_last_end_ns, min(t_issue_ns) AS t_first_ns, count(*) AS n_ops
FROM op_timing;
