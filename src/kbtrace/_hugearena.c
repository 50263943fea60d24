/* kbtrace._hugearena: pymalloc's arenas on transparent huge pages (issue 22).

   pymalloc, CPython's allocator for objects up to 512 bytes, takes its memory in arenas (1 MiB
   on 64-bit CPython 3.10+, 256 KiB before) from an arena allocator: by default one mmap per
   arena, on 4 KiB pages. Replay walks millions of small objects spread over hundreds of arenas,
   and its cycles go to TLB misses as much as to cache misses. This allocator carves the arenas
   out of 64 MiB chunks aligned to 2 MiB and madvised MADV_HUGEPAGE, so that with transparent
   huge pages in `madvise` or `always` mode the kernel backs them with 2 MiB pages.

   - A chunk is mmapped once and never unmapped; a bitmap per chunk says which of its arena
     slots are in use. An arena goes to the lowest free slot of the first chunk that has one.
   - A freed arena's slot is marked free; once every slot of its 2 MiB block is free, the block
     is released with MADV_DONTNEED (a whole aligned huge page: nothing is split, RSS falls, the
     next touch faults in a fresh huge page). A partly used block keeps its freed slot resident.
   - Arenas allocated before install() (and any request this scheme does not cover: another
     size, a full chunk table) go to and from the allocator that was installed before, so that
     arenas pymalloc made before the switch are freed by the allocator that made them.
   - Out of memory: mmap's failure is returned as NULL, which pymalloc turns into MemoryError.
   - pymalloc calls the arena allocator with the GIL held; no lock is needed here.

   install() is called only by processes kbtrace owns (kbtrace._hugepages, the `kbtrace` CLI);
   it can not be undone (arenas in the chunks must come back here). Without Linux's
   MADV_HUGEPAGE the module builds but install() returns False and changes nothing. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#if defined(__linux__) && defined(MADV_HUGEPAGE) && defined(MADV_DONTNEED)
#define HUGEARENA_SUPPORTED 1

#define CHUNK_SIZE ((size_t)64 << 20)  /* virtual size of one chunk */
#define HUGE_SIZE ((size_t)2 << 20)    /* x86-64 / arm64 (4 KiB base pages) PMD huge page */
#define MAX_CHUNKS 1024                /* 64 GiB of arenas; beyond it, the previous allocator */
#define MAX_SLOTS 256                  /* arena slots per chunk: arenas of >= 256 KiB */
#define WORDS (MAX_SLOTS / 64)

typedef struct {
    char *base;               /* 2 MiB aligned, CHUNK_SIZE long */
    uint64_t used[WORDS];     /* bit s: slot s (base + s * arena_size) holds an arena */
} chunk_t;

static PyObjectArenaAllocator prev;   /* the allocator before install() */
static int installed = 0;
static size_t arena_size = 0;         /* the size pymalloc asks for, learnt from its first call */
static size_t slots = 0;              /* CHUNK_SIZE / arena_size */
static chunk_t chunks[MAX_CHUNKS];
static int n_chunks = 0;
static size_t n_arenas = 0, n_passed = 0, n_released = 0;

/* A new chunk: mmap 2 MiB more than needed, unmap the unaligned head and the tail. */
static chunk_t *new_chunk(void)
{
    size_t len = CHUNK_SIZE + HUGE_SIZE;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    char *a = (char *)(((uintptr_t)p + HUGE_SIZE - 1) & ~(uintptr_t)(HUGE_SIZE - 1));
    if (a > p)
        munmap(p, (size_t)(a - p));
    if (p + len > a + CHUNK_SIZE)
        munmap(a + CHUNK_SIZE, (size_t)(p + len - (a + CHUNK_SIZE)));
    (void)madvise(a, CHUNK_SIZE, MADV_HUGEPAGE);   /* refused (THP off): 4 KiB pages, still fine */
    chunk_t *c = &chunks[n_chunks++];
    c->base = a;
    memset(c->used, 0, sizeof c->used);
    return c;
}

static void *h_alloc(void *ctx, size_t size)
{
    (void)ctx;
    if (arena_size == 0 && size >= CHUNK_SIZE / MAX_SLOTS && size <= HUGE_SIZE
            && HUGE_SIZE % size == 0) {
        arena_size = size;
        slots = CHUNK_SIZE / size;
    }
    if (size != arena_size)
        goto pass;
    for (int i = 0; i <= n_chunks; i++) {
        chunk_t *c;
        if (i < n_chunks) {
            c = &chunks[i];
        } else {
            if (n_chunks == MAX_CHUNKS)
                goto pass;
            if ((c = new_chunk()) == NULL)
                return NULL;
        }
        for (size_t w = 0; w * 64 < slots; w++) {
            uint64_t free_bits = ~c->used[w];
            if (slots - w * 64 < 64)
                free_bits &= ((uint64_t)1 << (slots - w * 64)) - 1;
            if (free_bits) {
                int b = __builtin_ctzll(free_bits);
                c->used[w] |= (uint64_t)1 << b;
                n_arenas++;
                return c->base + (w * 64 + (size_t)b) * arena_size;
            }
        }
    }
pass:
    n_passed++;
    return prev.alloc(prev.ctx, size);
}

static void h_free(void *ctx, void *ptr, size_t size)
{
    (void)ctx;
    for (int i = 0; i < n_chunks; i++) {
        chunk_t *c = &chunks[i];
        if ((char *)ptr < c->base || (char *)ptr >= c->base + CHUNK_SIZE)
            continue;
        size_t s = (size_t)((char *)ptr - c->base) / arena_size;
        c->used[s / 64] &= ~((uint64_t)1 << (s % 64));
        n_arenas--;
        /* the slots of ptr's 2 MiB block: all free -> give the huge page back */
        size_t per = HUGE_SIZE / arena_size, first = s - s % per;
        for (size_t k = first; k < first + per; k++)
            if (c->used[k / 64] >> (k % 64) & 1)
                return;
        (void)madvise(c->base + first * arena_size, HUGE_SIZE, MADV_DONTNEED);
        n_released++;
        return;
    }
    prev.free(prev.ctx, ptr, size);   /* made before install(), or passed on by h_alloc */
}
#endif /* HUGEARENA_SUPPORTED */

static PyObject *install(PyObject *self, PyObject *unused)
{
#ifdef HUGEARENA_SUPPORTED
    if (!installed) {
        PyObjectArenaAllocator mine = {NULL, h_alloc, h_free};
        PyObject_GetArenaAllocator(&prev);
        PyObject_SetArenaAllocator(&mine);
        installed = 1;
    }
    Py_RETURN_TRUE;
#else
    Py_RETURN_FALSE;
#endif
}

static PyObject *stats(PyObject *self, PyObject *unused)
{
#ifdef HUGEARENA_SUPPORTED
    return Py_BuildValue("{s:O,s:n,s:i,s:n,s:n,s:n}", "installed", installed ? Py_True : Py_False,
                         "arena_size", (Py_ssize_t)arena_size, "chunks", n_chunks,
                         "arenas", (Py_ssize_t)n_arenas, "passed_on", (Py_ssize_t)n_passed,
                         "blocks_released", (Py_ssize_t)n_released);
#else
    return Py_BuildValue("{s:O}", "installed", Py_False);
#endif
}

static PyMethodDef methods[] = {
    {"install", install, METH_NOARGS,
     "install() -> bool: pymalloc's arenas from now on on huge-page chunks (once; not undone). "
     "False where the platform has no MADV_HUGEPAGE (nothing changed)."},
    {"stats", stats, METH_NOARGS,
     "stats() -> dict: installed, arena_size, chunks, arenas (in use in the chunks), passed_on "
     "(requests handed to the previous allocator), blocks_released (2 MiB blocks given back)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kbtrace._hugearena",
                                    "pymalloc's arenas on transparent huge pages (see the C "
                                    "source's head comment).", -1, methods};

PyMODINIT_FUNC PyInit__hugearena(void) { return PyModule_Create(&module); }
