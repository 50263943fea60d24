-- _resources: every node and link of the topology as one resource list (helper).
--
-- Columns:
--   resource_kind (-)  'node' or 'link'
--   resource_idx (-)   node_idx or link_idx
--   resource_id (-)    node_id, or 'src_id->dst_id' for links
--   kind (-)           nodes.kind or links.kind
--   sip, cube, pe (-)  placement of the node (of the link's source node)
--   bw_gbps (GB/s)     link bandwidth, null for nodes
CREATE OR REPLACE VIEW _resources AS
SELECT 'node' AS resource_kind, node_idx AS resource_idx, node_id AS resource_id,
       CAST(kind AS VARCHAR) AS kind, sip, cube, pe, CAST(NULL AS DOUBLE) AS bw_gbps
FROM nodes
UNION ALL
SELECT 'link', l.link_idx, l.src_id || '->' || l.dst_id, CAST(l.kind AS VARCHAR),
       n.sip, n.cube, n.pe, l.bw_gbps
FROM links l LEFT JOIN nodes n ON n.node_idx = l.src_idx;
