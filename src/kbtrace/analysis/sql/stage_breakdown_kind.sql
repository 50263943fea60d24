-- stage_breakdown_kind: latency of each op kind split by the stage its hops were in.
--
-- Built on hops.crit_ns (the latency attributed to each hop; an op's crit_ns sum to its
-- t_end_ns - t_issue_ns), so per kind the time_ns over stages adds up to the summed
-- latency of that kind's ops that have hops. Rows in (kind, stage) order.
--
-- Columns:
--   kind (-)       op kind (ops.kind)
--   stage (-)      breakdown category of the hops (see _hop_ctx)
--   n_ops (-)      ops of this kind with a hop in this stage
--   time_ns (ns)   sum of crit_ns of those hops
--   busy_ns (ns)   sum of busy_ns of those hops
--   queue_ns (ns)  sum of queue_ns of those hops
--   share (-)      time_ns / (time_ns over all stages of this kind)
CREATE OR REPLACE VIEW stage_breakdown_kind AS
SELECT CAST(op_kind AS VARCHAR) AS kind, category AS stage, count(DISTINCT op_id) AS n_ops,
       sum(crit_ns) AS time_ns, sum(busy_ns) AS busy_ns, sum(queue_ns) AS queue_ns,
       sum(crit_ns) / nullif(sum(sum(crit_ns)) OVER (PARTITION BY op_kind), 0) AS share
FROM _hop_ctx GROUP BY op_kind, category
ORDER BY kind, stage;
