-- top_hotspots: the 10 resources where ops waited longest (queueing), worst first.
SELECT rank, resource_kind, resource_id, kind, n_queued, queue_ns, max_queue_ns,
       round(queue_share, 4) AS queue_share
FROM hotspots ORDER BY rank LIMIT 10;
