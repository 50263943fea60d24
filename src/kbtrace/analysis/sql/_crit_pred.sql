-- _crit_pred: for every op, the predecessor that released it last (helper for critical_path).
--
-- Candidates: explicit deps ('dep'), the matching send of a recv ('ipcq', via
-- match_op_id), the op that last released a resource this op queued on ('resource':
-- latest hop on the same node/link leaving by t_enter_ns + queue_ns), and the previous
-- op of the same program ('program'). Only candidates ending no later than the op are
-- kept (ties: lower op_id), and the latest-ending one wins; ties by edge
-- ipcq > dep > resource > program (a recv's send is also in its deps), then op_id.
-- Ops without a candidate are path starts.
--
-- Columns:
--   op_id (-)          the op
--   pred_op_id (-)     its binding predecessor
--   edge (-)           dep | ipcq | resource | program
--   pred_end_ns (ns)   t_end_ns of the predecessor
CREATE OR REPLACE VIEW _crit_pred AS
WITH res AS (
  SELECT op_id, CASE WHEN link_idx >= 0 THEN 'link' ELSE 'node' END AS rk,
         CASE WHEN link_idx >= 0 THEN link_idx ELSE node_idx END AS ri,
         t_enter_ns, t_leave_ns, queue_ns
  FROM hops
), cand AS (
  SELECT o.op_id, unnest(o.deps) AS pred_op_id, 'dep' AS edge, 1 AS prio FROM ops o
  UNION ALL
  SELECT op_id, match_op_id, 'ipcq', 0 FROM ops WHERE kind = 'recv' AND match_op_id IS NOT NULL
  UNION ALL
  SELECT q.op_id, arg_max(r.op_id, r.t_leave_ns), 'resource', 2
  FROM res q JOIN res r ON r.rk = q.rk AND r.ri = q.ri AND r.op_id <> q.op_id
   AND r.t_leave_ns <= q.t_enter_ns + q.queue_ns + 1e-9
  WHERE q.queue_ns > 0 GROUP BY q.op_id, q.rk, q.ri, q.t_enter_ns
  UNION ALL
  SELECT op_id, lag(op_id) OVER (PARTITION BY launch, program ORDER BY seq), 'program', 3
  FROM op_timing
), ranked AS (
  SELECT c.op_id, c.pred_op_id, c.edge, p.t_end_ns AS pred_end_ns,
         row_number() OVER (PARTITION BY c.op_id
                            ORDER BY p.t_end_ns DESC, c.prio, c.pred_op_id) AS rn
  FROM cand c
  JOIN op_timing x ON x.op_id = c.op_id
  JOIN op_timing p ON p.op_id = c.pred_op_id
  WHERE p.t_end_ns < x.t_end_ns OR (p.t_end_ns = x.t_end_ns AND p.op_id < x.op_id)
)
SELECT op_id, pred_op_id, edge, pred_end_ns FROM ranked WHERE rn = 1;
