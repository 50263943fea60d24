-- critical_path: the chain of ops across PEs that determines the makespan.
--
-- Walks back from the op that ends last through _crit_pred (dependencies, IPCQ
-- send->recv pairs, shared resources, program order). Each step contributes the time
-- from its predecessor's end to its own end, so contrib_ns over all steps adds up to
-- the makespan exactly: the first step counts from t = 0, and when the run's makespan
-- extends past the last op (launch completion travelling back to the host) a final
-- row with edge 'completion' and a null op_id covers that tail.
--
-- Columns:
--   step (-)              0 = first op on the path, increasing in time
--   op_id (-)             ops.op_id
--   sip, cube, pe (-)     placement of the op
--   kind, name (-)        op kind and name
--   engine (-)            engine that executed the op
--   edge (-)              how the op was released: dep | ipcq | resource | program | start
--                         (| completion for the launch-completion tail)
--   pred_op_id (-)        predecessor on the path (null for the first step)
--   t_from_ns (ns)        predecessor's end (0 for the first step)
--   t_start_ns (ns)       op start
--   t_end_ns (ns)         op end
--   wait_ns (ns)          max(0, t_start_ns - t_from_ns): waiting after release
--   contrib_ns (ns)       t_end_ns - t_from_ns
CREATE OR REPLACE VIEW critical_path AS
WITH RECURSIVE pred AS MATERIALIZED (   -- computed once, not per recursion step
  SELECT * FROM _crit_pred
), walk(depth, op_id) AS (
  SELECT 0, (SELECT op_id FROM op_timing ORDER BY t_end_ns DESC, op_id LIMIT 1)
  UNION ALL
  SELECT w.depth + 1, p.pred_op_id FROM walk w JOIN pred p ON p.op_id = w.op_id
)
SELECT (max(w.depth) OVER ()) - w.depth AS step, w.op_id, t.sip, t.cube, t.pe,
       CAST(t.kind AS VARCHAR) AS kind, CAST(t.name AS VARCHAR) AS name,
       CAST(t.engine AS VARCHAR) AS engine,
       coalesce(p.edge, 'start') AS edge, p.pred_op_id,
       coalesce(p.pred_end_ns, 0.0) AS t_from_ns, t.t_start_ns, t.t_end_ns,
       greatest(0.0, t.t_start_ns - coalesce(p.pred_end_ns, 0.0)) AS wait_ns,
       t.t_end_ns - coalesce(p.pred_end_ns, 0.0) AS contrib_ns
FROM walk w JOIN op_timing t USING (op_id) LEFT JOIN pred p USING (op_id)
WHERE w.op_id IS NOT NULL
UNION ALL
SELECT (SELECT count(*) FROM walk WHERE op_id IS NOT NULL), NULL, NULL, NULL, NULL,
       'launch', 'completion', NULL, 'completion',
       (SELECT op_id FROM op_timing ORDER BY t_end_ns DESC, op_id LIMIT 1),
       s.t_last_end_ns, s.t_last_end_ns, s.makespan_ns, 0.0, s.makespan_ns - s.t_last_end_ns
FROM _span s WHERE s.makespan_ns > s.t_last_end_ns;
