-- utilisation: busy fraction of every node and link over the makespan.
--
-- util = (union of busy intervals) / makespan, always in [0, 1]; load = (sum of busy_ns)
-- / makespan is the mean number of busy channels (can exceed 1 on multi-channel
-- resources such as an HBM controller). Unused resources appear with zeros. Rows in
-- (resource_kind, resource_idx) order: links, then nodes.
--
-- Columns:
--   resource_kind (-)  'node' (engine/node-only hops) or 'link'
--   resource_idx (-)   node_idx or link_idx
--   resource_id (-)    node_id, or 'src_id->dst_id' for links
--   kind (-)           node kind or link kind
--   sip, cube, pe (-)  placement (link: of its source node)
--   n_hops (-)         hops that used the resource
--   busy_ns (ns)       union of busy intervals
--   busy_sum_ns (ns)   sum of hop busy_ns
--   queue_ns (ns)      sum of hop queue_ns (waiting for this resource)
--   nbytes (bytes)     bytes through the resource
--   util (-)           busy_ns / makespan_ns, in [0, 1]
--   load (-)           busy_sum_ns / makespan_ns
--   gbps (GB/s)        nbytes / makespan_ns (1 GB/s = 1 byte/ns)
CREATE OR REPLACE VIEW utilisation AS
WITH hv AS (
  SELECT CASE WHEN link_idx >= 0 THEN 'link' ELSE 'node' END AS resource_kind,
         CASE WHEN link_idx >= 0 THEN link_idx ELSE node_idx END AS resource_idx,
         count(*) AS n_hops, sum(busy_ns) AS busy_sum_ns, sum(queue_ns) AS queue_ns,
         CAST(sum(nbytes) AS BIGINT) AS nbytes
  FROM hops GROUP BY ALL
), iv AS (
  SELECT resource_kind, resource_idx, sum(t1_ns - t0_ns) AS busy_ns
  FROM _busy_islands GROUP BY ALL
)
SELECT r.resource_kind, r.resource_idx, r.resource_id, r.kind, r.sip, r.cube, r.pe,
       coalesce(hv.n_hops, 0) AS n_hops,
       coalesce(iv.busy_ns, 0.0) AS busy_ns,
       coalesce(hv.busy_sum_ns, 0.0) AS busy_sum_ns,
       coalesce(hv.queue_ns, 0.0) AS queue_ns,
       coalesce(hv.nbytes, 0) AS nbytes,
       least(1.0, coalesce(iv.busy_ns, 0.0) / nullif(s.makespan_ns, 0)) AS util,
       coalesce(hv.busy_sum_ns, 0.0) / nullif(s.makespan_ns, 0) AS load,
       coalesce(hv.nbytes, 0) / nullif(s.makespan_ns, 0) AS gbps
FROM _resources r
LEFT JOIN hv USING (resource_kind, resource_idx)
LEFT JOIN iv USING (resource_kind, resource_idx)
CROSS JOIN _span s
ORDER BY r.resource_kind, r.resource_idx;
