-- stage_totals: exclusive stage time summed over all PEs, with its share of all PE time.
SELECT stage, sum(time_ns) AS time_ns, round(sum(time_ns) / sum(sum(time_ns)) OVER (), 4) AS share
FROM stage_breakdown_pe GROUP BY stage ORDER BY time_ns DESC, stage;
