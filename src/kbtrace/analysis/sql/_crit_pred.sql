-- _crit_pred: for every op, the predecessor that released it last (helper for critical_path).
--
-- Candidates: explicit deps ('dep'), the matching send of a recv ('ipcq', via
-- match_op_id), the op that last released a resource this op queued on ('resource':
-- the other ops whose hops on the same node/link left last by t_enter_ns + queue_ns,
-- all of them if several left at that instant; one ASOF join per queued hop, not a scan
-- of the resource's hops),
-- and the previous
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
), qres AS (       -- the hops on resources some hop queued on: only their leave times are
  SELECT * FROM res SEMI JOIN (SELECT DISTINCT rk, ri FROM res WHERE queue_ns > 0) USING (rk, ri)
), leave_t AS (    -- ever looked up (~1/8 of gemm's hops). Per resource and leave time:
  SELECT rk, ri, t_leave_ns,      -- the op if only one op left then
         CASE WHEN min(op_id) = max(op_id) THEN min(op_id) END AS sole
  FROM qres GROUP BY rk, ri, t_leave_ns
), leave_prev AS (
  SELECT *, lag(sole) OVER w AS prev_sole, lag(t_leave_ns) OVER w AS prev_t
  FROM leave_t WINDOW w AS (PARTITION BY rk, ri ORDER BY t_leave_ns)
), leave_run AS (   -- runs of consecutive leave times that all belong to one op
  SELECT *, sum(CASE WHEN sole IS NOT NULL AND sole = prev_sole THEN 0 ELSE 1 END)
              OVER (PARTITION BY rk, ri ORDER BY t_leave_ns ROWS UNBOUNDED PRECEDING) AS run
  FROM leave_prev
), leave_ix AS (    -- ... and the leave time just before the run
  SELECT rk, ri, t_leave_ns, sole,
         first_value(prev_t) OVER (PARTITION BY rk, ri, run ORDER BY t_leave_ns) AS t_before_run
  FROM leave_run
), queued AS (      -- one query per op, resource and entry: the longest wait
  SELECT op_id, rk, ri, max(t_enter_ns + queue_ns) + 1e-9 AS t_free
  FROM res WHERE queue_ns > 0 GROUP BY op_id, rk, ri, t_enter_ns
), last_other AS (  -- the last time another op left the resource by t_free
  SELECT q.op_id, q.rk, q.ri,
         CASE WHEN l.sole = q.op_id THEN l.t_before_run ELSE l.t_leave_ns END AS t_last
  FROM queued q ASOF JOIN leave_ix l
    ON l.rk = q.rk AND l.ri = q.ri AND l.t_leave_ns <= q.t_free
), cand AS (
  SELECT o.op_id, unnest(o.deps) AS pred_op_id, 'dep' AS edge, 1 AS prio FROM ops o
  UNION ALL
  SELECT op_id, match_op_id, 'ipcq', 0 FROM ops WHERE kind = 'recv' AND match_op_id IS NOT NULL
  UNION ALL
  -- every other op leaving the resource at that time (simultaneous releasers all compete)
  SELECT DISTINCT x.op_id, r.op_id, 'resource', 2
  FROM last_other x JOIN qres r
    ON r.rk = x.rk AND r.ri = x.ri AND r.t_leave_ns = x.t_last AND r.op_id <> x.op_id
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
