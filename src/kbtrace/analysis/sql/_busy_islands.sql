-- _busy_islands: union of the busy intervals of each resource (helper).
--
-- A hop on a link (link_idx >= 0) occupies the link; a node-only hop (link_idx = -1)
-- occupies its node. Overlapping busy intervals of one resource (multi-channel
-- resources such as HBM pseudo-channels) are merged, so utilisation built on the
-- islands is the fraction of time the resource had at least one busy channel and is
-- always within [0, 1].
--
-- Columns:
--   resource_kind (-)  'node' or 'link'
--   resource_idx (-)   node_idx or link_idx
--   t0_ns (ns)         island start
--   t1_ns (ns)         island end
CREATE OR REPLACE VIEW _busy_islands AS
WITH iv AS (
  SELECT CASE WHEN link_idx >= 0 THEN 'link' ELSE 'node' END AS resource_kind,
         CASE WHEN link_idx >= 0 THEN link_idx ELSE node_idx END AS resource_idx,
         t_busy_start_ns AS t0, t_leave_ns AS t1
  FROM _hop_ctx WHERE busy_ns > 0
), s AS (
  SELECT *, max(t1) OVER (PARTITION BY resource_kind, resource_idx ORDER BY t0, t1
                          ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
  FROM iv
), g AS (
  SELECT *, sum(CASE WHEN prev_end IS NULL OR t0 > prev_end THEN 1 ELSE 0 END)
              OVER (PARTITION BY resource_kind, resource_idx ORDER BY t0, t1
                    ROWS UNBOUNDED PRECEDING) AS island
  FROM s
)
SELECT resource_kind, resource_idx, min(t0) AS t0_ns, max(t1) AS t1_ns
FROM g GROUP BY resource_kind, resource_idx, island;
