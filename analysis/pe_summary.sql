-- pe_summary: per PE busy span, idle share and comm/compute overlap.
SELECT o.sip, o.cube, o.pe, o.span_ns, o.compute_ns, o.comm_ns, o.overlap_ns,
       round(o.comm_hidden, 4) AS comm_hidden,
       round(b.time_ns / o.span_ns, 4) AS idle_share
FROM overlap o JOIN stage_breakdown_pe b USING (sip, cube, pe)
WHERE b.stage = 'idle' ORDER BY o.sip, o.cube, o.pe;
