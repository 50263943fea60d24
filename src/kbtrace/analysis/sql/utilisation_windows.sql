-- utilisation_windows: busy fraction of every used node and link in equal time windows.
--
-- The makespan is cut into _config.n_windows equal windows (Run.set_windows(n); default
-- 20). For an arbitrary window use the table macro utilisation_between(t0_ns, t1_ns).
--
-- Columns:
--   resource_kind (-)  'node' or 'link'
--   resource_idx (-)   node_idx or link_idx
--   resource_id (-)    node_id, or 'src_id->dst_id' for links
--   kind (-)           node kind or link kind
--   win (-)            window index, 0-based
--   t0_ns (ns)         window start
--   t1_ns (ns)         window end
--   busy_ns (ns)       busy time of the resource inside the window
--   util (-)           busy_ns / (t1_ns - t0_ns), in [0, 1]
CREATE OR REPLACE VIEW utilisation_windows AS
WITH w AS (
  SELECT g.w AS win, g.w * s.makespan_ns / c.n_windows AS t0_ns,
         (g.w + 1) * s.makespan_ns / c.n_windows AS t1_ns
  FROM _span s CROSS JOIN _config c
  CROSS JOIN (SELECT unnest(range(CAST((SELECT n_windows FROM _config) AS BIGINT))) AS w) g
), used AS (SELECT DISTINCT resource_kind, resource_idx FROM _busy_islands)
SELECT u.resource_kind, u.resource_idx, r.resource_id, r.kind, w.win, w.t0_ns, w.t1_ns,
       coalesce(sum(CASE WHEN b.t0_ns IS NULL THEN 0.0
                      ELSE least(w.t1_ns, b.t1_ns) - greatest(w.t0_ns, b.t0_ns) END), 0.0)
         AS busy_ns,
       least(1.0, coalesce(sum(CASE WHEN b.t0_ns IS NULL THEN 0.0
                      ELSE least(w.t1_ns, b.t1_ns) - greatest(w.t0_ns, b.t0_ns) END), 0.0)
         / nullif(w.t1_ns - w.t0_ns, 0)) AS util  -- least(): float rounding only
FROM used u CROSS JOIN w
JOIN _resources r USING (resource_kind, resource_idx)
LEFT JOIN _busy_islands b
  ON b.resource_kind = u.resource_kind AND b.resource_idx = u.resource_idx
 AND b.t1_ns > w.t0_ns AND b.t0_ns < w.t1_ns
GROUP BY u.resource_kind, u.resource_idx, r.resource_id, r.kind, w.win, w.t0_ns, w.t1_ns;
