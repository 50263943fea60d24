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
-- Ops without a candidate are path starts. (Resources are one integer, link_idx or
-- -1 - node_idx; who left which resource when is computed once; the winner is an arg_min
-- per op, not a sort of the candidates: 12.5 -> 9.8 CPU s on gemm at 1.0 M ops.
-- Run.materialize computes the same rows in numpy: analysis/critpred.py, 2.9 CPU s there.)
--
-- Columns:
--   op_id (-)          the op
--   pred_op_id (-)     its binding predecessor
--   edge (-)           dep | ipcq | resource | program
--   pred_end_ns (ns)   t_end_ns of the predecessor
CREATE OR REPLACE VIEW _crit_pred AS
WITH res AS (      -- ri: the resource, link_idx for a link, -1 - node_idx for a node
  SELECT op_id, CASE WHEN link_idx >= 0 THEN link_idx ELSE -1 - node_idx END AS ri,
         t_enter_ns, t_leave_ns, queue_ns
  FROM hops
), queued AS (      -- one query per op, resource and entry: the longest wait
  SELECT op_id, ri, max(t_enter_ns + queue_ns) + 1e-9 AS t_free
  FROM res WHERE queue_ns > 0 GROUP BY op_id, ri, t_enter_ns
), leavers AS MATERIALIZED (  -- who left each resource some hop queued on, and when: only
  SELECT DISTINCT ri, t_leave_ns, op_id FROM res   -- those are ever looked up (~1/8 of
  SEMI JOIN (SELECT DISTINCT ri FROM queued) USING (ri)  -- gemm's hops)
), leave_t AS (    -- per resource and leave time: the op if only one op left then
  SELECT ri, t_leave_ns, CASE WHEN min(op_id) = max(op_id) THEN min(op_id) END AS sole
  FROM leavers GROUP BY ri, t_leave_ns
), leave_prev AS (
  SELECT *, lag(sole) OVER w AS prev_sole, lag(t_leave_ns) OVER w AS prev_t
  FROM leave_t WINDOW w AS (PARTITION BY ri ORDER BY t_leave_ns)
), leave_ix AS (    -- ... and the leave time just before its run of consecutive leave times
  SELECT ri, t_leave_ns, sole,   -- that all belong to one op (the latest run start's: the
         max(CASE WHEN sole IS NOT NULL AND sole = prev_sole THEN NULL ELSE prev_t END)
           OVER (PARTITION BY ri ORDER BY t_leave_ns ROWS UNBOUNDED PRECEDING) AS t_before_run
  FROM leave_prev   -- largest, as leave times grow; NULL in the first run)
), last_other AS (  -- the last time another op left the resource by t_free
  SELECT q.op_id, q.ri,
         CASE WHEN l.sole = q.op_id THEN l.t_before_run ELSE l.t_leave_ns END AS t_last
  FROM queued q ASOF JOIN leave_ix l ON l.ri = q.ri AND l.t_leave_ns <= q.t_free
), cand AS (
  SELECT o.op_id, unnest(o.deps) AS pred_op_id, 'dep' AS edge, 1 AS prio FROM ops o
  UNION ALL
  SELECT op_id, match_op_id, 'ipcq', 0 FROM ops WHERE kind = 'recv' AND match_op_id IS NOT NULL
  UNION ALL
  -- every other op leaving the resource at that time (simultaneous releasers all compete)
  SELECT DISTINCT x.op_id, r.op_id, 'resource', 2
  FROM last_other x JOIN leavers r
    ON r.ri = x.ri AND r.t_leave_ns = x.t_last AND r.op_id <> x.op_id
  UNION ALL
  SELECT op_id, lag(op_id) OVER (PARTITION BY launch, program ORDER BY seq), 'program', 3
  FROM op_timing
), best AS (        -- the latest-ending candidate; ties by edge priority, then op_id
  SELECT c.op_id, arg_min(struct_pack(pred_op_id := c.pred_op_id, edge := c.edge,
                                      pred_end_ns := p.t_end_ns),
                          struct_pack(a := -p.t_end_ns, b := c.prio, c := c.pred_op_id)) AS w
  FROM cand c
  JOIN op_timing x ON x.op_id = c.op_id
  JOIN op_timing p ON p.op_id = c.pred_op_id
  WHERE p.t_end_ns < x.t_end_ns OR (p.t_end_ns = x.t_end_ns AND p.op_id < x.op_id)
  GROUP BY c.op_id
)
SELECT op_id, w.pred_op_id, w.edge, w.pred_end_ns FROM best;
