-- critical_path_summary: critical-path time by op kind and release edge.
SELECT kind, edge, count(*) AS n_ops, sum(contrib_ns) AS contrib_ns,
       round(sum(contrib_ns) / (SELECT makespan_ns FROM _span), 4) AS share_of_makespan
FROM critical_path GROUP BY kind, edge ORDER BY contrib_ns DESC, kind, edge;
