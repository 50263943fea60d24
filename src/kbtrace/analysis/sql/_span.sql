-- _span: the run's time extent (helper).
--
-- The replay clock starts at 0 ns, so the makespan is the end of the last op.
--
-- Columns:
--   makespan_ns (ns)  end of the last op = max(op_timing.t_end_ns)
--   t_first_ns (ns)   earliest op issue time
--   n_ops (-)         replayed ops
CREATE OR REPLACE VIEW _span AS
SELECT max(t_end_ns) AS makespan_ns, min(t_issue_ns) AS t_first_ns, count(*) AS n_ops
FROM op_timing;
