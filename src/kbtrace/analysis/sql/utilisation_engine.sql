-- utilisation_engine: busy fraction of each executing engine (op_timing.engine) over the makespan.
--
-- An engine is busy from an op's t_start_ns to its t_end_ns; overlapping ops on one
-- engine (async composites, DMA channels) are merged, so util is within [0, 1].
--
-- Columns:
--   engine (-)         node_id of the engine
--   kind (-)           node kind of the engine (dma, gemm, math, ipcq, pe_cpu, ...)
--   sip, cube, pe (-)  placement of the engine
--   n_ops (-)          ops executed by the engine
--   busy_ns (ns)       union of [t_start_ns, t_end_ns] of its ops
--   util (-)           busy_ns / makespan_ns, in [0, 1]
CREATE OR REPLACE VIEW utilisation_engine AS
WITH s AS (
  SELECT engine, t_start_ns AS t0, t_end_ns AS t1,
         max(t_end_ns) OVER (PARTITION BY engine ORDER BY t_start_ns, t_end_ns
                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
  FROM op_timing
), g AS (
  SELECT *, sum(CASE WHEN prev_end IS NULL OR t0 > prev_end THEN 1 ELSE 0 END)
              OVER (PARTITION BY engine ORDER BY t0, t1 ROWS UNBOUNDED PRECEDING) AS island
  FROM s
), isl AS (
  SELECT engine, island, min(t0) AS t0, max(t1) AS t1, count(*) AS n FROM g GROUP BY ALL
)
SELECT CAST(i.engine AS VARCHAR) AS engine, CAST(n.kind AS VARCHAR) AS kind,
       n.sip, n.cube, n.pe, CAST(sum(i.n) AS BIGINT) AS n_ops, sum(i.t1 - i.t0) AS busy_ns,
       sum(i.t1 - i.t0) / nullif(any_value(sp.makespan_ns), 0) AS util
FROM isl i LEFT JOIN nodes n ON n.node_id = i.engine CROSS JOIN _span sp
GROUP BY i.engine, n.kind, n.sip, n.cube, n.pe;
