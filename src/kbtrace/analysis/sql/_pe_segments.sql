-- _pe_segments: each PE's busy span cut where a category starts or stops, one exclusive stage per piece (helper).
--
-- The hop intervals [t_enter_ns, t_leave_ns] of the ops placed on the PE are merged per
-- category into islands (maximal overlapping or touching runs). Islands of one category
-- are disjoint, so a sweep over the island bounds keeps the set of active categories as
-- one bit mask (a running sum of +-bit). Each piece is attributed to ONE stage by
-- priority gemm > math > fetch > store > hbm_queue > dma_read > dma_write > ipcq > other
-- (schema.BREAKDOWN_STAGES), or 'idle' when nothing is active, so the pieces of a PE add up
-- to its span exactly. Priority rationale: time hidden behind compute is not a
-- data-movement cost. hbm_queue: the queue part [t_enter_ns, t_enter_ns + queue_ns] of the
-- hbm hops of the PE's transfers (waiting for a pseudo-channel); the whole hop also counts
-- for its transfer's category, which the rest of the hop's time falls to.
--
-- Columns:
--   sip, cube, pe (-)    PE coordinates
--   t0_ns, t1_ns (ns)    piece bounds
--   dur_ns (ns)          t1_ns - t0_ns
--   stage (-)            exclusive stage of the piece (or idle)
--   has_compute (-)      a fetch/gemm/math/store hop is active
--   has_comm (-)         an hbm_queue/dma_read/dma_write/ipcq interval is active
CREATE OR REPLACE VIEW _pe_segments AS
WITH iv AS (        -- the intervals of each category: every hop, plus HBM queueing apart
  SELECT sip, cube, pe, category, t_enter_ns, t_leave_ns FROM _hop_ctx
  UNION ALL
  SELECT sip, cube, pe, 'hbm_queue', t_enter_ns, t_enter_ns + queue_ns FROM _hop_ctx
  WHERE stage = 'hbm' AND queue_ns > 0 AND category <> 'other'
), mx AS (          -- per PE and category, intervals by start, with the latest end before each
  SELECT sip, cube, pe, category, t_enter_ns AS s, t_leave_ns AS e,
         max(t_leave_ns) OVER (PARTITION BY sip, cube, pe, category ORDER BY t_enter_ns, t_leave_ns
                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_e
  FROM iv
), isl AS (         -- islands: a hop starting after every earlier one ended opens a new one
  SELECT *, sum(CASE WHEN prev_e IS NULL OR s > prev_e THEN 1 ELSE 0 END)
              OVER (PARTITION BY sip, cube, pe, category ORDER BY s, e
                    ROWS UNBOUNDED PRECEDING) AS k
  FROM mx
), islands AS (    -- bit: the category's bit in the mask, by priority (gemm = 1 ... other = 256)
  SELECT sip, cube, pe, min(s) AS s, max(e) AS e,
         CASE category WHEN 'gemm' THEN 1 WHEN 'math' THEN 2 WHEN 'fetch' THEN 4
              WHEN 'store' THEN 8 WHEN 'hbm_queue' THEN 16 WHEN 'dma_read' THEN 32
              WHEN 'dma_write' THEN 64 WHEN 'ipcq' THEN 128 ELSE 256 END AS bit
  FROM isl GROUP BY sip, cube, pe, category, k
), ev AS (         -- island bounds as changes of the PE's active-category bit mask
  SELECT sip, cube, pe, s AS t, bit AS d FROM islands
  UNION ALL SELECT sip, cube, pe, e, -bit FROM islands
  UNION ALL SELECT sip, cube, pe, t0_ns, 0 FROM _pe_span
  UNION ALL SELECT sip, cube, pe, t1_ns, 0 FROM _pe_span
), pt AS (
  SELECT sip, cube, pe, t, sum(d) AS d FROM ev GROUP BY sip, cube, pe, t
), cnt AS (         -- islands of one category are disjoint, so one running sum is the mask
  SELECT sip, cube, pe, t AS t0_ns,
    lead(t) OVER (PARTITION BY sip, cube, pe ORDER BY t) AS t1_ns,
    CAST(sum(d) OVER (PARTITION BY sip, cube, pe ORDER BY t ROWS UNBOUNDED PRECEDING)
         AS INTEGER) AS mask
  FROM pt
), clip AS (
  SELECT c.*, greatest(c.t0_ns, s.t0_ns) AS a, least(c.t1_ns, s.t1_ns) AS b
  FROM cnt c JOIN _pe_span s USING (sip, cube, pe)
)
SELECT sip, cube, pe, a AS t0_ns, b AS t1_ns, b - a AS dur_ns,
  CASE WHEN mask & 1 <> 0 THEN 'gemm' WHEN mask & 2 <> 0 THEN 'math'
       WHEN mask & 4 <> 0 THEN 'fetch' WHEN mask & 8 <> 0 THEN 'store'
       WHEN mask & 16 <> 0 THEN 'hbm_queue' WHEN mask & 32 <> 0 THEN 'dma_read'
       WHEN mask & 64 <> 0 THEN 'dma_write' WHEN mask & 128 <> 0 THEN 'ipcq'
       WHEN mask & 256 <> 0 THEN 'other' ELSE 'idle' END AS stage,
  mask & 15 <> 0 AS has_compute,
  mask & 240 <> 0 AS has_comm
FROM clip WHERE t1_ns IS NOT NULL AND b > a;
