"""One Llama-70B decoder layer: RMSNorm, GQA attention, SwiGLU MLP, tensor parallel over SIPs.

Tensor parallel (Megatron) over the SIPs (``tp`` = SIP count): each SIP owns ``heads/tp``
query heads, ``kv_heads/tp`` KV heads and ``ffn/tp`` MLP columns; the fused QKV and
gate/up projections are column-parallel, the output and down projections row-parallel, and
their partial results are all-reduced across the SIPs (a ring over the SIPs, one per
(cube, PE) position, ``global_E`` / ``global_W`` IPCQ). Data parallel over every cube and
PE of a SIP: ``batch`` sequences (default one per (cube, PE)) are dealt to the programs; the
programs at the same (cube, PE) of all SIPs serve the same sequences. Weights: each SIP's
slices, replicated on PE 0 of each of its cubes.

Per sequence and program (``phase=prefill``: ``seq`` tokens, causal attention;
``phase=decode``: one new token per sequence attending to a KV cache of ``seq`` positions
plus itself, its K and V appended to the cache first)::

    h = rmsnorm(x) -> composite [q k v] = h @ Wqkv_s -> per KV head: load K^T, V; per
    query head of the group: softmax(q K^T / sqrt(dh) + mask) V -> composite h @ Wo_s ->
    all-reduce over SIPs -> x1 = x + . -> rmsnorm -> composite [g u] = h @ Wgu_s ->
    silu(g) * u -> composite . @ Wd_s -> all-reduce -> y = x1 + .

Composite GEMMs are tiled by the PE's plan with ``tile_m/k/n``. Full Llama-70B sizes
(``d_model=8192 heads=64 kv_heads=8 ffn=28672``, d_head 128) are far too large to capture
with data; ``op_counts(p, topo)`` gives the op count per kind at any size (the kernel's
loop structure, checked against real captures at small sizes by the tests), printed by
``kbtrace capture llama_layer --dry-run``.
"""

import math

import numpy as np

PARAMS = {"phase": "prefill", "batch": 0, "seq": 8, "d_model": 64, "heads": 8, "kv_heads": 2,
          "ffn": 128, "tile_m": 32, "tile_k": 64, "tile_n": 32, "dtype": "f32", "seed": 0}
FULL = {"d_model": 8192, "heads": 64, "kv_heads": 8, "ffn": 28672}
EPS = 1e-5


def _shape(p, tp):
    dh = p.d_model // p.heads
    hs, kvs, fs = p.heads // tp, p.kv_heads // tp, p.ffn // tp
    rows = p.seq if p.phase == "prefill" else 1
    ctx = p.seq + 1 if p.phase == "decode" else p.seq
    nqkv = (hs + 2 * kvs) * dh
    return dh, hs, kvs, fs, rows, ctx, nqkv


def _rmsnorm(tl, x, g, dm):
    ms = tl.sum(x * x, axis=1) * (1.0 / dm)
    return x / tl.sqrt(ms + EPS) * g


def _allreduce(tl, part, tp, shape, nxt, prv):
    acc, cur = part, part
    for _ in range(tp - 1):
        tl.send(nxt, cur)
        cur = tl.recv(prv, shape, "f32")
        acc = acc + cur
    return acc


def _gemm(tl, a_ptr, a_shape, b_ptr, b_shape, out_ptr, tile, dtype):
    h = tl.composite(op="gemm", a=tl.ref(a_ptr, a_shape, dtype), b=tl.ref(b_ptr, b_shape, dtype),
                     out_ptr=out_ptr, tile_shape=tile)
    tl.wait(h)


def layer_kernel(tl, x_ptr, y_ptr, kv_ptr, scr_ptr, mask_ptr, W, nseq, p_seq, decode, dm,
                 heads, kv_heads, ffn, tile, dtype, tp, nxt, prv):
    esz = tl.sizeof(dtype)
    hs, kvs, fs, dh = heads // tp, kv_heads // tp, ffn // tp, dm // heads
    rows = 1 if decode else p_seq
    ctx = p_seq + 1 if decode else p_seq
    nqkv = (hs + 2 * kvs) * dh
    wqkv, wo, wgu, wd, g1, g2 = W[tl.sip_id()][tl.cube_id()]
    scale = 1.0 / math.sqrt(dh)
    # scratch per program: h | qkv | attn | part | gu | act  (rows x ... each)
    o_h = scr_ptr
    o_qkv = o_h + rows * dm * esz
    o_att = o_qkv + rows * nqkv * esz
    o_part = o_att + rows * hs * dh * esz
    o_gu = o_part + rows * dm * esz
    o_act = o_gu + rows * 2 * fs * esz
    gamma1 = tl.load(g1, (1, dm), dtype)
    gamma2 = tl.load(g2, (1, dm), dtype)
    mask = None if decode else tl.load(mask_ptr, (rows, rows), "f32")
    for i in range(nseq):
        x = tl.load(x_ptr + i * rows * dm * esz, (rows, dm), dtype)
        tl.store(o_h, _rmsnorm(tl, x, gamma1, dm))
        _gemm(tl, o_h, (rows, dm), wqkv, (dm, nqkv), o_qkv, tile, dtype)
        kv = kv_ptr + i * ctx * 2 * kvs * dh * esz      # this sequence's K | V cache rows
        kstride = 2 * kvs * dh
        if decode:   # append the new token's K and V to the cache (row ctx - 1)
            new = tl.load(o_qkv + hs * dh * esz, (1, 2 * kvs * dh), dtype)
            tl.store(kv + (ctx - 1) * kstride * esz, new)
            ksrc, ks, n_k = kv, kstride, ctx
        else:
            ksrc, ks, n_k = o_qkv + hs * dh * esz, nqkv, rows
        for j in range(kvs):
            kt = tl.load(ksrc + j * dh * esz, (dh, n_k), dtype, strides=(1, ks))
            v = tl.load(ksrc + (kvs + j) * dh * esz, (n_k, dh), dtype, strides=(ks, 1))
            for g in range(hs // kvs):
                hd = j * (hs // kvs) + g
                q = tl.load(o_qkv + hd * dh * esz, (rows, dh), dtype, strides=(nqkv, 1))
                s = tl.dot(q, kt) * scale
                if mask is not None:
                    s = s + mask
                o = tl.dot(tl.softmax(s, axis=1), v)
                tl.store(o_att + hd * dh * esz, o, strides=(hs * dh, 1))
        _gemm(tl, o_att, (rows, hs * dh), wo, (hs * dh, dm), o_part, tile, dtype)
        part = tl.load(o_part, (rows, dm), "f32")
        x1 = x + _allreduce(tl, part, tp, (rows, dm), nxt, prv)
        tl.store(o_h, _rmsnorm(tl, x1, gamma2, dm))
        _gemm(tl, o_h, (rows, dm), wgu, (dm, 2 * fs), o_gu, tile, dtype)
        gate = tl.load(o_gu, (rows, fs), dtype, strides=(2 * fs, 1))
        up = tl.load(o_gu + fs * esz, (rows, fs), dtype, strides=(2 * fs, 1))
        tl.store(o_act, gate * tl.sigmoid(gate) * up)
        _gemm(tl, o_act, (rows, fs), wd, (fs, dm), o_part, tile, dtype)
        part2 = tl.load(o_part, (rows, dm), "f32")
        tl.store(y_ptr + i * rows * dm * esz, x1 + _allreduce(tl, part2, tp, (rows, dm), nxt,
                                                              prv))


def op_counts(p, topo):
    """Ops per kind of the whole layer (every program), from the kernel's loop structure."""
    _check(p, topo)
    tp = topo.n_sips
    progs = topo.n_sips * topo.cubes_per_sip * topo.pes_per_cube
    per_prog_seqs = _seqs_per_program(p, topo)
    dh, hs, kvs, fs, rows, ctx, nqkv = _shape(p, tp)
    decode = p.phase == "decode"
    c = {"load": 2 + (0 if decode else 1), "store": 0, "math": 0, "dot": 0, "composite": 0,
         "wait": 0, "send": 0, "recv": 0}
    per = {"load": 1 + (1 if decode else 0) + 2 * kvs + hs + 1 + 2 + 1,
           "store": 1 + (1 if decode else 0) + hs + 1 + 1 + 1,
           # rmsnorm 7 ops x 2; per head: scale, (mask add), softmax; residual adds 2; allreduce
           # adds; silu-gate 3
           "math": 14 + hs * (2 + (0 if decode else 1)) + 2 + 2 * (tp - 1) + 3,
           "dot": 2 * hs, "composite": 4, "wait": 4, "send": 2 * (tp - 1), "recv": 2 * (tp - 1)}
    for k, v in per.items():
        c[k] += v * per_prog_seqs
    return {k: v * progs for k, v in c.items() if v}


def _seqs_per_program(p, topo):
    slots = topo.cubes_per_sip * topo.pes_per_cube
    batch = p.batch or slots
    if batch % slots:
        raise ValueError(f"batch={batch} must be a multiple of the {slots} (cube, PE) slots "
                         "of a SIP (data parallel)")
    return batch // slots


def _check(p, topo):
    tp = topo.n_sips
    if p.phase not in ("prefill", "decode"):
        raise ValueError(f"phase={p.phase!r}: use prefill or decode")
    if p.d_model % p.heads or p.heads % p.kv_heads:
        raise ValueError(f"d_model={p.d_model}, heads={p.heads}, kv_heads={p.kv_heads}: d_model "
                         "must split over heads and heads over kv_heads")
    for name in ("heads", "kv_heads", "ffn"):
        if getattr(p, name) % tp:
            raise ValueError(f"{name}={getattr(p, name)} must split over the {tp} SIPs "
                             "(tensor parallel)")
    if p.seq < 1:
        raise ValueError(f"seq={p.seq} must be >= 1")


def build(w, p):
    topo = w.topo
    _check(p, topo)
    tp, cps, ppc = topo.n_sips, topo.cubes_per_sip, topo.pes_per_cube
    nseq = _seqs_per_program(p, topo)
    dh, hs, kvs, fs, rows, ctx, nqkv = _shape(p, tp)
    dm, H, KV, F = p.d_model, p.heads, p.kv_heads, p.ffn
    rng = np.random.default_rng(p.seed + 7)

    def mat(*shape):
        return (rng.uniform(-1, 1, size=shape) / math.sqrt(shape[0])).astype(np.float32)
    wq, wk, wv, wo = mat(dm, H * dh), mat(dm, KV * dh), mat(dm, KV * dh), mat(H * dh, dm)
    wg, wu, wd = mat(dm, F), mat(dm, F), mat(F, dm)
    g1 = rng.uniform(0.5, 1.5, size=(1, dm)).astype(np.float32)
    g2 = rng.uniform(0.5, 1.5, size=(1, dm)).astype(np.float32)
    W = []
    for s in range(tp):
        hsl = slice(s * hs * dh, (s + 1) * hs * dh)
        ksl = slice(s * kvs * dh, (s + 1) * kvs * dh)
        fsl = slice(s * fs, (s + 1) * fs)
        parts = {"wqkv": np.concatenate([wq[:, hsl], wk[:, ksl], wv[:, ksl]], axis=1),
                 "wo": wo[hsl], "wgu": np.concatenate([wg[:, fsl], wu[:, fsl]], axis=1),
                 "wd": wd[fsl], "g1": g1, "g2": g2}
        W.append([[w.tensor(f"{n}_s{s}c{c}", a.shape, p.dtype, init=a, pe=(s, c, 0)).addr
                   for n, a in parts.items()] for c in range(cps)])
    progs = tp * cps * ppc
    slots = cps * ppc
    # sequence b is served by slot b // nseq (cube, PE) of every SIP; shard i = program i
    x_all = w.random(p.seed).draw((slots * nseq, rows, dm), p.dtype)
    x = w.tensor("x", (progs * nseq * rows, dm), p.dtype, shard="all",
                 init=np.concatenate([x_all.reshape(-1, dm)] * tp))
    y = w.tensor("y", (progs * nseq * rows, dm), p.dtype, shard="all")
    cache = np.zeros((slots * nseq, ctx, 2 * kvs * dh * tp), np.float32)
    if p.phase == "decode":   # past K, V of every position (random), per SIP its heads
        cache[:, :-1] = w.random(p.seed + 3).draw(cache[:, :-1].shape, p.dtype)
    kv_init = np.concatenate([_sip_cols(cache, s, kvs * dh, tp).reshape(-1, 2 * kvs * dh)
                              for s in range(tp)])
    kv = w.tensor("kv", (progs * nseq * ctx, 2 * kvs * dh), p.dtype, shard="all", init=kv_init)
    scr_elems = rows * (dm + nqkv + hs * dh + dm + 2 * fs + fs)
    scr = w.tensor("scratch", (progs, scr_elems), p.dtype, shard="all")
    mask = np.triu(np.full((rows, rows), -1e30, np.float32), k=1)
    m = w.tensor("mask", (progs * rows, rows), "f32", shard="all", init=np.tile(mask, (progs, 1)))
    nb = {}
    for s in range(tp):
        for i in range(slots):
            me = s * slots + i
            nb[me] = {"global_E": ((s + 1) % tp) * slots + i, "global_W": ((s - 1) % tp) * slots + i}
    w.launch(layer_kernel, args=(x, y, kv, scr, m, W, nseq, p.seq, p.phase == "decode", dm, H,
                                 KV, F, (p.tile_m, p.tile_k, p.tile_n), p.dtype, tp, "global_E",
                                 "global_W"), neighbors=nb if tp > 1 else None)

    def ref(v):
        xs = v["x"][: slots * nseq * rows].astype(np.float64).reshape(slots * nseq, rows, dm)
        kvc = cache.astype(np.float64)
        out = np.stack([_ref_seq(xs[b], kvc[b], p, tp, dh, kvs, wq, wk, wv, wo, wg, wu, wd,
                                 g1, g2) for b in range(slots * nseq)])
        return np.concatenate([out.reshape(-1, dm)] * tp)
    w.output(y, reference=ref)


def _sip_cols(cache, s, width, tp):
    """SIP s's K | V columns of a [K_all | V_all]-ordered cache (K of kv head j at j*dh)."""
    kall = cache[..., : width * tp]
    vall = cache[..., width * tp:]
    return np.concatenate([kall[..., s * width:(s + 1) * width],
                           vall[..., s * width:(s + 1) * width]], axis=-1)


def _ref_seq(x, cache, p, tp, dh, kvs, wq, wk, wv, wo, wg, wu, wd, g1, g2):
    def rms(a, g):
        return a / np.sqrt((a * a).mean(axis=1, keepdims=True) + EPS) * g
    H, KV = p.heads, p.kv_heads
    h = rms(x, g1)
    q, k, v = h @ wq, h @ wk, h @ wv
    if p.phase == "decode":
        K = np.concatenate([cache[:-1, : KV * dh], k])
        V = np.concatenate([cache[:-1, KV * dh:], v])
    else:
        K, V = k, v
    rows = x.shape[0]
    att = np.zeros((rows, H * dh))
    for hd in range(H):
        j = (hd // (H // tp)) * kvs + (hd % (H // tp)) // ((H // tp) // kvs)
        s = q[:, hd * dh:(hd + 1) * dh] @ K[:, j * dh:(j + 1) * dh].T / math.sqrt(dh)
        if p.phase == "prefill":
            s = s + np.triu(np.full((rows, rows), -1e30), k=1)
        e = np.exp(s - s.max(axis=1, keepdims=True))
        att[:, hd * dh:(hd + 1) * dh] = (e / e.sum(axis=1, keepdims=True)) @ V[:, j * dh:(j + 1) * dh]
    x1 = x + att @ wo
    h2 = rms(x1, g2)
    gt, up = h2 @ wg, h2 @ wu
    return x1 + (gt / (1 + np.exp(-gt)) * up) @ wd
