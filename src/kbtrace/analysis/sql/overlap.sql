-- overlap: how much of each PE's communication was hidden behind its compute.
--
-- Communication = dma_read, dma_write and ipcq hops (with the fabric/HBM hops of those
-- transfers); compute = fetch, gemm, math and store hops; times are unions over the PE.
-- One row per PE, in (sip, cube, pe) order.
--
-- Columns:
--   sip, cube, pe (-)     PE coordinates
--   span_ns (ns)          the PE's busy span
--   compute_ns (ns)       time with at least one compute hop active
--   comm_ns (ns)          time with at least one communication hop active
--   overlap_ns (ns)       time with both active
--   comm_hidden (-)       overlap_ns / comm_ns (1 = all communication hidden)
--   compute_share (-)     compute_ns / span_ns
CREATE OR REPLACE VIEW overlap AS
SELECT p.sip, p.cube, p.pe, p.span_ns,
       coalesce(sum(s.dur_ns) FILTER (WHERE s.has_compute), 0.0) AS compute_ns,
       coalesce(sum(s.dur_ns) FILTER (WHERE s.has_comm), 0.0) AS comm_ns,
       coalesce(sum(s.dur_ns) FILTER (WHERE s.has_compute AND s.has_comm), 0.0) AS overlap_ns,
       coalesce(sum(s.dur_ns) FILTER (WHERE s.has_compute AND s.has_comm), 0.0)
         / nullif(sum(s.dur_ns) FILTER (WHERE s.has_comm), 0) AS comm_hidden,
       coalesce(sum(s.dur_ns) FILTER (WHERE s.has_compute), 0.0) / nullif(p.span_ns, 0)
         AS compute_share
FROM _pe_span p LEFT JOIN _pe_segments s USING (sip, cube, pe)
GROUP BY p.sip, p.cube, p.pe, p.span_ns
ORDER BY p.sip, p.cube, p.pe;
