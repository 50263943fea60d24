-- busiest_links: the 10 most utilised links over the makespan.
SELECT resource_id, kind, n_hops, nbytes, round(util, 4) AS util, round(gbps, 3) AS gbps
FROM utilisation WHERE resource_kind = 'link' AND n_hops > 0
ORDER BY util DESC, resource_idx LIMIT 10;
