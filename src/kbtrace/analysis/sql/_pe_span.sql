-- _pe_span: the busy span of every PE (helper).
--
-- Columns:
--   sip, cube, pe (-)  PE coordinates
--   t0_ns (ns)         first issue of an op placed on the PE
--   t1_ns (ns)         last end of an op placed on the PE
--   span_ns (ns)       t1_ns - t0_ns
CREATE OR REPLACE VIEW _pe_span AS
SELECT sip, cube, pe, min(t_issue_ns) AS t0_ns, max(t_end_ns) AS t1_ns,
       max(t_end_ns) - min(t_issue_ns) AS span_ns
FROM op_timing GROUP BY sip, cube, pe;
