-- utilisation_between: table macro, busy fraction of every used node and link in [a, b) ns.
--
-- Usage: SELECT * FROM utilisation_between(0, 1000) ORDER BY util DESC
--
-- Columns:
--   resource_kind (-)  'node' or 'link'
--   resource_idx (-)   node_idx or link_idx
--   resource_id (-)    node_id, or 'src_id->dst_id' for links
--   kind (-)           node kind or link kind
--   busy_ns (ns)       busy time inside [a, b)
--   util (-)           busy_ns / (b - a), in [0, 1]
CREATE OR REPLACE MACRO utilisation_between(a, b) AS TABLE
SELECT i.resource_kind, i.resource_idx, r.resource_id, r.kind,
       sum(greatest(0.0, least(b, i.t1_ns) - greatest(a, i.t0_ns))) AS busy_ns,
       least(1.0, sum(greatest(0.0, least(b, i.t1_ns) - greatest(a, i.t0_ns))) / (b - a)) AS util
FROM _busy_islands i JOIN _resources r USING (resource_kind, resource_idx)
GROUP BY i.resource_kind, i.resource_idx, r.resource_id, r.kind;
