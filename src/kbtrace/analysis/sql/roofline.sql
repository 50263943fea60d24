-- roofline: per PE, the work its ops did against the machine's peaks: GEMM FLOPs, HBM bytes, intensity, bound.
--
-- flops counts 2*m*n*k per dot and per composite gemm (MAC-array work); math and fill ops
-- are not MAC-array work and are counted apart (vector_ops: their output elements).
-- hbm_bytes is the data the PE's ops moved to or from any HBM slice (the 'hbm' hop rows:
-- a read at the controller, a write at its destination). Rates are over the PE's busy
-- span. The peaks come from run.json (kbtrace replay writes the topology's): GEMM
-- 2 * mac_rows * mac_cols * clock_ghz GFLOP/s and HBM pcs_per_pe * pc_bw_gbps * efficiency
-- GB/s (the PE's own slice) per PE; NULL for runs written before they were recorded.
-- The roof is min(peak_gflops, intensity * peak_hbm_gbps); the ridge point is
-- peak_gflops / peak_hbm_gbps FLOP/B. The memory roof assumes a PE streams from its own
-- slice: one that reads several slices at once (more than one DMA read channel) can pass
-- it (attainment > 1). Host copies are left out.
--
-- Columns:
--   sip, cube, pe (-)        PE coordinates
--   span_ns (ns)             busy span of the PE (first issue to last end of its ops)
--   flops (FLOP)             2*m*n*k over its dot and composite gemm ops
--   vector_ops (-)           output elements of its math and fill ops
--   hbm_bytes (bytes)        bytes its ops moved to or from HBM
--   intensity (FLOP/B)       flops / hbm_bytes (NULL without HBM traffic)
--   gflops (GFLOP/s)         flops / span_ns
--   hbm_gbps (GB/s)          hbm_bytes / span_ns
--   peak_gflops (GFLOP/s)    GEMM peak of one PE
--   peak_hbm_gbps (GB/s)     HBM peak of one PE's slice
--   roof_gflops (GFLOP/s)    what the roofline allows at this intensity
--   bound (-)                'memory' below the ridge point, 'compute' at or above it (NULL without flops or peaks)
--   attainment (-)           gflops / roof_gflops
CREATE OR REPLACE VIEW roofline AS
WITH work AS (
  SELECT sip, cube, pe,
         sum(CASE WHEN kind = 'dot' OR (kind = 'composite' AND name = 'gemm')
                  THEN CAST(2 AS DOUBLE) * m * n * k ELSE CAST(0 AS DOUBLE) END) AS flops,
         sum(CASE WHEN kind IN ('math', 'fill') THEN coalesce(list_product(out_shape), 1)
                  ELSE 0 END) AS vector_ops
  FROM ops WHERE kind NOT IN ('h2d', 'd2h') GROUP BY sip, cube, pe
), moved AS (
  SELECT sip, cube, pe, sum(nbytes) AS hbm_bytes FROM _hop_ctx
  WHERE stage = 'hbm' AND op_kind NOT IN ('h2d', 'd2h') GROUP BY sip, cube, pe
), r AS (
  SELECT w.sip, w.cube, w.pe, s.span_ns, w.flops, CAST(w.vector_ops AS BIGINT) AS vector_ops,
         CAST(coalesce(m.hbm_bytes, 0) AS BIGINT) AS hbm_bytes,
         (SELECT gemm_gflops_per_pe FROM _run_meta) AS peak_gflops,
         (SELECT hbm_gbps_per_pe FROM _run_meta) AS peak_hbm_gbps
  FROM work w JOIN _pe_span s USING (sip, cube, pe) LEFT JOIN moved m USING (sip, cube, pe)
), x AS (
  SELECT *, flops / nullif(hbm_bytes, 0) AS intensity, flops / nullif(span_ns, 0) AS gflops,
         hbm_bytes / nullif(span_ns, 0) AS hbm_gbps
  FROM r
)
SELECT sip, cube, pe, span_ns, flops, vector_ops, hbm_bytes, intensity, gflops, hbm_gbps,
       peak_gflops, peak_hbm_gbps,
       CASE WHEN intensity IS NULL THEN peak_gflops
            ELSE least(peak_gflops, intensity * peak_hbm_gbps) END AS roof_gflops,
       CASE WHEN flops = 0 OR peak_gflops IS NULL OR peak_hbm_gbps IS NULL THEN NULL
            WHEN intensity IS NULL OR intensity >= peak_gflops / peak_hbm_gbps THEN 'compute'
            ELSE 'memory' END AS bound,
       CASE WHEN flops = 0 THEN NULL
            ELSE gflops / (CASE WHEN intensity IS NULL THEN peak_gflops
                                ELSE least(peak_gflops, intensity * peak_hbm_gbps) END) END
         AS attainment
FROM x ORDER BY sip, cube, pe;
