-- hotspots: resources ranked by total queueing delay (where ops waited).
--
-- Only resources with some queueing appear; rank 1 is the worst.
--
-- Columns:
--   rank (-)           1 = most total queueing; ties by resource_kind, resource_idx
--   resource_kind (-)  'node' or 'link'
--   resource_idx (-)   node_idx or link_idx
--   resource_id (-)    node_id, or 'src_id->dst_id' for links
--   kind (-)           node kind or link kind
--   n_hops (-)         hops through the resource
--   n_queued (-)       hops that waited (queue_ns > 0)
--   queue_ns (ns)      total waiting time
--   max_queue_ns (ns)  longest single wait
--   busy_ns (ns)       sum of hop busy_ns on the resource
--   queue_share (-)    queue_ns / (total queue_ns of all resources)
CREATE OR REPLACE VIEW hotspots AS
WITH q AS (
  SELECT CASE WHEN link_idx >= 0 THEN 'link' ELSE 'node' END AS resource_kind,
         CASE WHEN link_idx >= 0 THEN link_idx ELSE node_idx END AS resource_idx,
         count(*) AS n_hops, count(*) FILTER (WHERE queue_ns > 0) AS n_queued,
         sum(queue_ns) AS queue_ns, max(queue_ns) AS max_queue_ns, sum(busy_ns) AS busy_ns
  FROM hops GROUP BY ALL
)
SELECT row_number() OVER (ORDER BY q.queue_ns DESC, q.resource_kind, q.resource_idx) AS rank,
       q.resource_kind, q.resource_idx, r.resource_id, r.kind, q.n_hops, q.n_queued,
       q.queue_ns, q.max_queue_ns, q.busy_ns,
       q.queue_ns / sum(q.queue_ns) OVER () AS queue_share
FROM q JOIN _resources r USING (resource_kind, resource_idx)
WHERE q.queue_ns > 0;
