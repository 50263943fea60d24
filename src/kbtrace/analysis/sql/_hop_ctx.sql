-- _hop_ctx: hops joined with their op's placement and kind, plus the breakdown category (helper).
--
-- category maps the hop stage to the stage-breakdown buckets: compute and DMA stages keep
-- their name; fabric/hbm/sram hops belong to the transfer that crosses them (dma_write
-- for stores, ipcq for send/recv, dma_read otherwise); launch, pe_cpu, pcie and host
-- copies are 'other'. The busy part of a hop is placed at its tail:
-- [t_leave_ns - busy_ns, t_leave_ns] (a resource is released when the tail leaves).
--
-- Columns:
--   (all hops columns)
--   sip, cube, pe (-)        placement of the op the hop belongs to
--   op_kind, op_name (-)     ops.kind / ops.name of that op
--   category (-)             dma_read|fetch|gemm|math|store|dma_write|ipcq|other
--   t_busy_start_ns (ns)     start of the exclusive busy interval of the hop
CREATE OR REPLACE VIEW _hop_ctx AS
SELECT h.*, t.sip, t.cube, t.pe, t.kind AS op_kind, t.name AS op_name,
       CASE
         WHEN t.kind IN ('h2d', 'd2h') THEN 'other'
         WHEN h.stage IN ('dma_read', 'fetch', 'gemm', 'math', 'store', 'dma_write', 'ipcq')
           THEN CAST(h.stage AS VARCHAR)
         WHEN h.stage IN ('fabric', 'hbm', 'sram') THEN
           CASE WHEN t.kind = 'store' THEN 'dma_write'
                WHEN t.kind IN ('send', 'recv') THEN 'ipcq'
                ELSE 'dma_read' END
         ELSE 'other'
       END AS category,
       greatest(h.t_enter_ns, h.t_leave_ns - h.busy_ns) AS t_busy_start_ns
FROM hops h JOIN op_timing t USING (op_id);
