-- _pe_segments: each PE's busy span cut where a category starts or stops, one exclusive stage per piece (helper).
--
-- The hop intervals [t_enter_ns, t_leave_ns] of the ops placed on the PE are merged per
-- category into islands (maximal overlapping or touching runs), and a sweep over the
-- island bounds counts the active islands per category. Each piece is attributed to ONE stage by
-- priority gemm > math > fetch > store > dma_read > dma_write > ipcq > other, or
-- 'idle' when nothing is active, so the pieces of a PE add up to its span exactly.
-- Priority rationale: time hidden behind compute is not a data-movement cost.
--
-- Columns:
--   sip, cube, pe (-)    PE coordinates
--   t0_ns, t1_ns (ns)    piece bounds
--   dur_ns (ns)          t1_ns - t0_ns
--   stage (-)            exclusive stage of the piece (or idle)
--   has_compute (-)      a fetch/gemm/math/store hop is active
--   has_comm (-)         a dma_read/dma_write/ipcq hop is active
CREATE OR REPLACE VIEW _pe_segments AS
WITH mx AS (        -- per PE and category, hops by start, with the latest end before each
  SELECT sip, cube, pe, category, t_enter_ns AS s, t_leave_ns AS e,
         max(t_leave_ns) OVER (PARTITION BY sip, cube, pe, category ORDER BY t_enter_ns, t_leave_ns
                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_e
  FROM _hop_ctx
), isl AS (         -- islands: a hop starting after every earlier one ended opens a new one
  SELECT *, sum(CASE WHEN prev_e IS NULL OR s > prev_e THEN 1 ELSE 0 END)
              OVER (PARTITION BY sip, cube, pe, category ORDER BY s, e
                    ROWS UNBOUNDED PRECEDING) AS k
  FROM mx
), islands AS (
  SELECT sip, cube, pe, category, min(s) AS s, max(e) AS e
  FROM isl GROUP BY sip, cube, pe, category, k
), ev AS (
  SELECT sip, cube, pe, s AS t, category, 1 AS d FROM islands
  UNION ALL SELECT sip, cube, pe, e, category, -1 FROM islands
  UNION ALL SELECT sip, cube, pe, t0_ns, NULL, 0 FROM _pe_span
  UNION ALL SELECT sip, cube, pe, t1_ns, NULL, 0 FROM _pe_span
), pt AS (
  SELECT sip, cube, pe, t,
    sum(CASE WHEN category = 'gemm' THEN d ELSE 0 END) AS d_gemm,
    sum(CASE WHEN category = 'math' THEN d ELSE 0 END) AS d_math,
    sum(CASE WHEN category = 'fetch' THEN d ELSE 0 END) AS d_fetch,
    sum(CASE WHEN category = 'store' THEN d ELSE 0 END) AS d_store,
    sum(CASE WHEN category = 'dma_read' THEN d ELSE 0 END) AS d_dma_read,
    sum(CASE WHEN category = 'dma_write' THEN d ELSE 0 END) AS d_dma_write,
    sum(CASE WHEN category = 'ipcq' THEN d ELSE 0 END) AS d_ipcq,
    sum(CASE WHEN category = 'other' THEN d ELSE 0 END) AS d_other
  FROM ev GROUP BY sip, cube, pe, t
), cnt AS (
  SELECT sip, cube, pe, t AS t0_ns,
    lead(t) OVER (PARTITION BY sip, cube, pe ORDER BY t) AS t1_ns,
    sum(d_gemm) OVER w AS n_gemm, sum(d_math) OVER w AS n_math,
    sum(d_fetch) OVER w AS n_fetch, sum(d_store) OVER w AS n_store,
    sum(d_dma_read) OVER w AS n_dma_read, sum(d_dma_write) OVER w AS n_dma_write,
    sum(d_ipcq) OVER w AS n_ipcq, sum(d_other) OVER w AS n_other
  FROM pt
  WINDOW w AS (PARTITION BY sip, cube, pe ORDER BY t ROWS UNBOUNDED PRECEDING)
), clip AS (
  SELECT c.*, greatest(c.t0_ns, s.t0_ns) AS a, least(c.t1_ns, s.t1_ns) AS b
  FROM cnt c JOIN _pe_span s USING (sip, cube, pe)
)
SELECT sip, cube, pe, a AS t0_ns, b AS t1_ns, b - a AS dur_ns,
  CASE WHEN n_gemm > 0 THEN 'gemm' WHEN n_math > 0 THEN 'math' WHEN n_fetch > 0 THEN 'fetch'
       WHEN n_store > 0 THEN 'store' WHEN n_dma_read > 0 THEN 'dma_read'
       WHEN n_dma_write > 0 THEN 'dma_write' WHEN n_ipcq > 0 THEN 'ipcq'
       WHEN n_other > 0 THEN 'other' ELSE 'idle' END AS stage,
  (n_gemm + n_math + n_fetch + n_store) > 0 AS has_compute,
  (n_dma_read + n_dma_write + n_ipcq) > 0 AS has_comm
FROM clip WHERE t1_ns IS NOT NULL AND b > a;
