"""Llama-70B grouped-query attention over a ring of ranks: prefill with a KV ring, decode with
a partial-softmax combine (ADR-0057 panels, commitlog §16).

One KV head and its ``G`` query heads (Llama-70B: 64 query / 8 KV heads, G = 8, d_head 128;
``D`` defaults to 64, the reference's validation scale). GQA folds the G heads into the
rows: query row ``s * G + g`` is position s, head g, and every row attends to the same K, V,
so ``O = softmax(Q K^T / sqrt(D)) V`` over the stacked rows is exactly per-head attention.

``panel``:

* ``single_user_*``: one user; the ranks are the PEs of cube 0 (an ``intra_E/W`` ring).
* ``multi_user_*``: one user per PE (``pes_per_cube`` users, data parallel over PEs); each
  user's ranks are that PE on every cube (a cube-level ``E/W`` ring). The reference ran one
  user this way and left 7 of 8 PEs idle; here every PE serves a user.
* ``*_prefill``: ``S`` positions split over the n ranks (S/n queries and S/n keys each).
  Each rank keeps its queries and passes its K^T and V blocks around the ring: n steps of
  ``s = q kT * scale``, online softmax, ``acc = p v + acc * alpha`` (2 GEMMs per step).
* ``*_decode``: one new position (its G query rows on every rank), the ``S`` cached keys
  split over the ranks. Each rank computes a partial attention (2 GEMMs: ``q kT``, ``p v``)
  with its own max ``m``, sum ``l`` and output ``o``; the partials are combined along a
  chain toward rank 0 (``M = max(m_a, m_b)``, ``l = l_a e^(m_a-M) + l_b e^(m_b-M)``, ``o``
  likewise), which stores ``o / l``. GEMMs per user = 2 x ranks (ADR-0056 D3).

Outputs ``o`` (per rank for prefill; rank 0's rows for decode, the others zero) are checked
against numpy.
"""

import numpy as np

PARAMS = {"panel": "single_user_prefill", "S": 128, "G": 8, "D": 64, "dtype": "f32",
          "seed": 0}
PANELS = ("single_user_prefill", "multi_user_prefill", "single_user_decode",
          "multi_user_decode")


def prefill_kernel(tl, q_ptr, k_ptr, v_ptr, o_ptr, n, rows, sr, D, dtype, nxt, prv):
    scale = 1.0 / float(D) ** 0.5
    q = tl.load(q_ptr, (rows, D), dtype)
    kt = tl.load(k_ptr, (D, sr), dtype, strides=(1, D))
    v = tl.load(v_ptr, (sr, D), dtype)
    acc = tl.zeros((rows, D), "f32")
    m = tl.full((rows, 1), -1e30, "f32")
    l = tl.zeros((rows, 1), "f32")  # noqa: E741 - the paper's name
    for step in range(n):
        if step < n - 1:                       # pass the block on before using it
            tl.send(nxt, kt)
            tl.send(nxt, v)
        s = tl.dot(q, kt) * scale
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m - m_new)
        l = l * alpha + tl.sum(p, axis=1)  # noqa: E741
        acc = tl.dot(p, v, acc * alpha)
        m = m_new
        if step < n - 1:
            kt = tl.recv(prv, (D, sr), dtype)
            v = tl.recv(prv, (sr, D), dtype)
    tl.store(o_ptr, acc / l)


def decode_kernel(tl, q_ptr, k_ptr, v_ptr, o_ptr, n, rank, G, sr, D, dtype, toward0, away):
    scale = 1.0 / float(D) ** 0.5
    q = tl.load(q_ptr, (G, D), dtype)
    kt = tl.load(k_ptr, (D, sr), dtype, strides=(1, D))
    v = tl.load(v_ptr, (sr, D), dtype)
    s = tl.dot(q, kt) * scale
    m = tl.max(s, axis=1)
    p = tl.exp(s - m)
    l = tl.sum(p, axis=1)  # noqa: E741
    o = tl.dot(p, v)
    if rank < n - 1:                           # fold in the partials of ranks above
        m_b = tl.recv(away, (G, 1), "f32")
        l_b = tl.recv(away, (G, 1), "f32")
        o_b = tl.recv(away, (G, D), "f32")
        big = tl.maximum(m, m_b)
        a = tl.exp(m - big)
        b = tl.exp(m_b - big)
        l = l * a + l_b * b  # noqa: E741
        o = o * a + o_b * b
        m = big
    if rank > 0:
        tl.send(toward0, m)
        tl.send(toward0, l)
        tl.send(toward0, o)
    else:
        tl.store(o_ptr, o / l)


def _attention(q, k, v):
    s = q @ k.T / np.sqrt(q.shape[1])
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)) @ v


def build(w, p):
    if p.panel not in PANELS:
        raise ValueError(f"panel={p.panel!r}: use one of {', '.join(PANELS)}")
    topo = w.topo
    ppc, cubes = topo.pes_per_cube, topo.n_sips * topo.cubes_per_sip
    multi = p.panel.startswith("multi")
    n = cubes if multi else ppc               # ranks per user
    users = ppc if multi else 1
    if n < 2:
        raise ValueError(f"panel={p.panel} needs >= 2 ranks; {topo.params.name!r} gives {n}")
    if p.S % n:
        raise ValueError(f"S={p.S} must be a multiple of the {n} ranks")
    sr = p.S // n
    decode = p.panel.endswith("decode")
    rows = p.G if decode else sr * p.G        # query rows per rank
    shards = n * users
    shard = "all" if multi else "pes"
    seed = p.seed
    # user u, rank r lives in shard (r * users + u) (multi: cube r, PE u; single: PE r)
    kv_shape = (shards * sr, p.D)
    k = w.tensor("k", kv_shape, p.dtype, init=w.random(seed + 1), shard=shard)
    v = w.tensor("v", kv_shape, p.dtype, init=w.random(seed + 2), shard=shard)
    if decode:
        one = w.random(seed).draw((users, p.G, p.D), p.dtype)   # one query per user
        qv = np.stack([one[i % users] for i in range(shards)]).reshape(shards * p.G, p.D)
        q = w.tensor("q", qv.shape, p.dtype, init=qv, shard=shard)
    else:
        q = w.tensor("q", (shards * rows, p.D), p.dtype, init=w.random(seed), shard=shard)
    o = w.tensor("o", (shards * rows, p.D), p.dtype, shard=shard)
    nb: dict[int, dict[str, int]] = {}
    pre = "" if multi else "intra_"
    for r in range(n):
        for u in range(users):
            me, nx, pv = (r * users + u, ((r + 1) % n) * users + u, ((r - 1) % n) * users + u)
            if decode:
                d = {}
                if r > 0:
                    d[pre + "W"] = pv
                if r < n - 1:
                    d[pre + "E"] = nx
                nb[me] = d
            else:
                nb[me] = {pre + "E": nx, pre + "W": pv}
    grid = (ppc, cubes) if multi else (ppc, 1)
    if decode:
        # every program: rank = its place in its user's chain
        w.launch(_decode_launcher, grid=grid,
                 args=(q, k, v, o, n, users, p.G, sr, p.D, p.dtype, pre + "W", pre + "E"),
                 neighbors=nb)
    else:
        w.launch(prefill_kernel, grid=grid,
                 args=(q, k, v, o, n, rows, sr, p.D, p.dtype, pre + "E", pre + "W"),
                 neighbors=nb)

    def ref(vals):
        qq, kk, vv = (vals[x].astype(np.float64) for x in ("q", "k", "v"))
        qq = qq.reshape(n, users, rows, p.D)
        kk = kk.reshape(n, users, sr, p.D)
        vv = vv.reshape(n, users, sr, p.D)
        out = np.zeros((n, users, rows, p.D))
        for u in range(users):
            K = kk[:, u].reshape(-1, p.D)
            V = vv[:, u].reshape(-1, p.D)
            if decode:
                out[0, u] = _attention(qq[0, u], K, V)
            else:
                out[:, u] = _attention(qq[:, u].reshape(-1, p.D), K, V).reshape(n, rows, p.D)
        return out.reshape(n * users * rows, p.D)
    w.output(o, reference=ref)


def _decode_launcher(tl, q_ptr, k_ptr, v_ptr, o_ptr, n, users, G, sr, D, dtype, toward0, away):
    me = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    decode_kernel(tl, q_ptr, k_ptr, v_ptr, o_ptr, n, me // users, G, sr, D, dtype, toward0,
                  away)
