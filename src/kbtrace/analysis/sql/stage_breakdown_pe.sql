-- stage_breakdown_pe: where each PE's busy span went, by exclusive stage.
--
-- One row per PE and stage (hbm_queue, dma_read, fetch, gemm, math, store, dma_write, ipcq,
-- other, idle: schema.BREAKDOWN_STAGES and idle), zeros included. Per PE, time_ns over all stages adds up to span_ns exactly
-- (overlapping work is attributed by the priority documented in _pe_segments). Rows come by
-- PE, then in the stage order above (what the report's per-PE table and plot show).
--
-- Columns:
--   sip, cube, pe (-)  PE coordinates
--   stage (-)          exclusive stage, or idle
--   time_ns (ns)       time attributed to the stage
--   span_ns (ns)       the PE's busy span (first issue to last end)
--   share (-)          time_ns / span_ns
CREATE OR REPLACE VIEW stage_breakdown_pe AS
WITH st(stage, ord) AS (VALUES ('hbm_queue', 0), ('dma_read', 1), ('fetch', 2), ('gemm', 3),
  ('math', 4), ('store', 5), ('dma_write', 6), ('ipcq', 7), ('other', 8), ('idle', 9)),
agg AS (SELECT sip, cube, pe, stage, sum(dur_ns) AS time_ns FROM _pe_segments GROUP BY ALL)
SELECT p.sip, p.cube, p.pe, st.stage, coalesce(agg.time_ns, 0.0) AS time_ns, p.span_ns,
       coalesce(agg.time_ns, 0.0) / nullif(p.span_ns, 0) AS share
FROM _pe_span p CROSS JOIN st
LEFT JOIN agg ON agg.sip = p.sip AND agg.cube = p.cube AND agg.pe = p.pe AND agg.stage = st.stage
ORDER BY p.sip, p.cube, p.pe, st.ord;
