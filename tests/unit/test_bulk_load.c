/* test_bulk_load.c -- mango_batch_bulk_begin / _end (include/mango.h):
 * a batch fills the heap without capturing its stores, and the end logs the
 * heap in pieces, then the batch. What must hold:
 *   - the loaded state (lists of nodes of many sizes, frees among them, a
 *     fresh calloc'ed table written sparsely, .data/.bss stores) survives a
 *     restart, with the heap's own check passing, and the bulk's log is
 *     about the heap's size, in several pieces;
 *   - atomicity: killed after bulk_begin's commit, or after piece 1, 2 or
 *     the last but one, a restart finds the state of before the bulk,
 *     exactly, with a heap that passes its check, also when frees were
 *     queued as the bulk began (free_spares_paused);
 *   - that state's allocator is not fooled by the pieces: a large calloc
 *     carved where the pieces wrote (above the old top) is zero, in memory
 *     and after another restart (the first piece raises the durable root's
 *     high-water mark; without it the pool keeps the pieces' bytes there);
 *   - kill loop in sim mode (which drops everything not synced): SIGKILL at
 *     random moments of a load; the state is before or after, never between,
 *     and never before once the load was acknowledged;
 *   - the progress hook is called once a piece, with growing byte counts
 *     ending at the total, and may pause and resume the batch;
 *   - a piece whose sync fails: the bulk end reports it, the batch is
 *     dropped, and a restart holds the state of before;
 *   - a load ended by mango_batch_submit instead (pipelined in fs and sim
 *     modes; the submit ends the bulk) is there once its ticket is durable;
 *   - misuse: begin without a batch, twice, on a paused batch, end without
 *     begin: MANGO_EINVAL.
 * Usage: test_bulk_load [child MODE POOL FD | load MODE POOL [submit] | verify[-phase] MODE POOL MIN]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <glob.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "alloc/durable_heap.h"
#include "mango.h"

#include "check.h"
#include "kill_child.h"
#include "test_config.h"

#define BEFORE_NODES 200
#define LOAD_NODES 24000    /* about 12 MiB with the table: ~12 pieces of a 4 MiB log */
#define TABLE (3u << 20)    /* calloc'ed fresh inside the load */
#define PROBE (6u << 20)    /* calloc'ed after a recovery to the state before */

typedef struct node {
    struct node *next;
    uint64_t i, len;
    unsigned char bytes[]; /* len bytes of pattern(i) */
} node;

#define SPARE 64         /* small objects made before, freed just before the bulk */

typedef struct state {
    uint64_t phase;      /* 1: before list made; 2: loaded */
    void *spare[SPARE];  /* 40 bytes each (a slab class); dropped by the load */
    node *before;        /* BEFORE_NODES nodes */
    node *load;          /* the load's list (after the frees) */
    uint64_t load_count, load_sum;
    unsigned char *table;
    unsigned char *probe; /* verify's calloc, checked by a second verify */
} state;
static state *st;
static uint64_t bss_marker; /* a .data/.bss store inside the bulk (captured as usual) */

static unsigned char pattern(uint64_t i, uint64_t k) { return (unsigned char)(i * 131 + k * 7 + 1); }
static uint64_t node_len(uint64_t i) { return 24 + (i * 97) % 1000 + (i % 50 == 0 ? 6000 : 0); }

static void init_state(void *arg)
{
    (void)arg;
    st = calloc(1, sizeof *st);
    mango_capture(&st, sizeof st);
    mango_capture(st, sizeof *st);
}
static bool is_ro(void *c) { (void)c; return true; }
static void nop(void *c) { (void)c; }

static int start(const char *pool, const char *mode)
{
    mango_config cfg;
    small_test_config(&cfg, pool, test_mode_named(mode));
    cfg.pool_size = 96u << 20;
    cfg.log_size = 4u << 20;
    mango_callbacks cb = {.is_read_only = is_ro, .process_request = nop, .init_state = init_state};
    return mango_init(&cfg, &cb);
}

static node *new_node(uint64_t i)
{
    uint64_t len = node_len(i);
    node *n = malloc(sizeof *n + len);
    if (!n)
        return NULL;
    n->i = i;
    n->len = len;
    n->next = NULL;
    for (uint64_t k = 0; k < len; k++)
        n->bytes[k] = pattern(i, k);
    return n;
}

/* Batch 1: the state before the bulk (captured as usual). */
static int make_before(void)
{
    if (mango_batch_begin() != MANGO_OK)
        return 1;
    node *head = NULL;
    for (uint64_t i = 0; i < BEFORE_NODES; i++) {
        node *n = new_node(1000000 + i);
        if (!n)
            return 1;
        mango_capture(n, sizeof *n + n->len);
        n->next = head;
        mango_capture(&n->next, sizeof n->next);
        head = n;
    }
    st->before = head;
    for (int i = 0; i < SPARE; i++) {
        st->spare[i] = malloc(40);
        if (!st->spare[i])
            return 1;
        memset(st->spare[i], 0x11, 40);
        mango_capture(st->spare[i], 40);
    }
    st->phase = 1;
    mango_capture(st, sizeof *st);
    return mango_batch_end() == MANGO_OK ? 0 : 1;
}

/* Frees queued when the bulk begins: the spare objects, dropped by a batch
 * of their own, then freed while the load's batch is paused (queued, as
 * frees of durable objects from outside a write section are), so
 * bulk_begin's new batch drains them. The root the first piece carries must
 * be the durable one, without those frees: until session 36 it carried them,
 * and a kill after piece 1 recovered slab free lists naming objects the pool
 * still had in use (found by a review). */
static int free_spares_paused(void)
{
    void *spare[SPARE];
    int n = 0;
    if (mango_batch_begin() != MANGO_OK)
        return 1;
    for (int i = 0; i < SPARE; i++)
        if (st->spare[i]) {
            spare[n++] = st->spare[i];
            st->spare[i] = NULL;
            mango_capture(&st->spare[i], sizeof st->spare[i]);
        }
    if (mango_batch_end() != MANGO_OK || mango_batch_begin() != MANGO_OK || mango_batch_pause() != MANGO_OK)
        return 1;
    for (int i = 0; i < n; i++)
        free(spare[i]);
    return mango_batch_resume() == MANGO_OK ? 0 : 1;
}

/* The progress hook (mango_set_bulk_progress): pauses and resumes the batch,
 * as an event loop answering clients does, and checks what it is told. */
static struct {
    uint64_t calls, last_done, total, bad;
} progress;

static void on_progress(void *arg, uint64_t done, uint64_t total)
{
    (void)arg;
    if (done <= progress.last_done || (progress.calls && total != progress.total) || done > total)
        progress.bad++;
    progress.calls++;
    progress.last_done = done;
    progress.total = total;
    if (mango_batch_pause() != MANGO_OK || mango_batch_resume() != MANGO_OK)
        progress.bad++;
}

/* Batch 2: the bulk. No heap store is captured here on purpose: the bulk
 * must log them all by itself. submit: end with mango_batch_submit and wait
 * for the ticket (pipelined in fs and sim modes), and without bulk_end (the
 * submit ends the bulk). */
static int make_load(bool submit)
{
    if (free_spares_paused() != 0) /* opens the load's batch */
        return 1;
    if (mango_batch_bulk_begin() != MANGO_OK)
        return 1;
    node *head = NULL, *prev = NULL;
    uint64_t count = 0, sum = 0;
    for (uint64_t i = 0; i < LOAD_NODES; i++) {
        node *n = new_node(i);
        if (!n)
            return 1;
        if (i % 7 == 3 && prev) { /* free some: the free lists change too */
            free(prev);
            prev = NULL;
            continue;
        }
        if (prev) {
            prev->next = head;
            head = prev;
        }
        prev = n;
    }
    if (prev) {
        prev->next = head;
        head = prev;
    }
    for (node *n = head; n; n = n->next) {
        count++;
        sum += n->i * 31 + n->len;
    }
    unsigned char *t = calloc(1, TABLE);
    if (!t)
        return 1;
    for (uint64_t k = 0; k < TABLE; k += 4099)
        t[k] = pattern(k, 3);
    st->table = t;
    st->load = head;
    st->load_count = count;
    st->load_sum = sum;
    st->phase = 2;
    bss_marker = sum;
    mango_capture(&bss_marker, sizeof bss_marker);
    mango_stats s0, s1;
    mango_get_stats(&s0);
    memset(&progress, 0, sizeof progress);
    mango_set_bulk_progress(on_progress, NULL);
    int rc;
    if (submit) {
        uint64_t ticket = 0;
        rc = mango_batch_submit(&ticket) == MANGO_OK && mango_wait_durable(ticket) == MANGO_OK ? 0 : 1;
        mango_get_stats(&s1);
        s1.batches--; /* the batch itself */
    } else {
        if (mango_batch_bulk_end() != MANGO_OK) {
            fprintf(stderr, "load: mango_batch_bulk_end: %s\n", mango_last_error());
            /* An application that ends the batch anyway: nothing may commit. */
            if (mango_batch_end() == MANGO_OK)
                fprintf(stderr, "load: the batch ended without an error after a failed bulk end\n");
            return 1;
        }
        mango_get_stats(&s1);
        rc = mango_batch_end() == MANGO_OK ? 0 : 1;
    }
    mango_set_bulk_progress(NULL, NULL);
    uint64_t pieces = s1.batches - s0.batches;
    printf("bulk: %llu pieces, %llu log bytes for the pieces, %llu progress calls\n", (unsigned long long)pieces,
           (unsigned long long)(s1.log_bytes - s0.log_bytes), (unsigned long long)progress.calls);
    if (progress.bad || progress.calls != pieces || progress.last_done != progress.total || pieces < 2) {
        fprintf(stderr, "load: progress calls %llu (bad %llu) for %llu pieces, last %llu of %llu\n",
                (unsigned long long)progress.calls, (unsigned long long)progress.bad, (unsigned long long)pieces,
                (unsigned long long)progress.last_done, (unsigned long long)progress.total);
        return 1;
    }
    return rc;
}

/* The recovered state: 0 or why not. */
static const char *state_problem(uint64_t min_phase)
{
    static char why[160];
    if (dheap_check() != 0)
        return "the heap's check failed";
    if (st->phase == 0 && min_phase == 0) {
        /* Killed before the first batch was acknowledged: nothing yet. */
        if (st->before || st->load || st->table || bss_marker)
            return "phase 0 with data";
        return NULL;
    }
    if (st->phase < 1 || st->phase > 2 || st->phase < min_phase) {
        snprintf(why, sizeof why, "phase %llu (at least %llu expected)", (unsigned long long)st->phase,
                 (unsigned long long)min_phase);
        return why;
    }
    uint64_t nb = 0;
    for (node *n = st->before; n; n = n->next, nb++)
        for (uint64_t k = 0; k < n->len; k++)
            if (n->len != node_len(n->i) || n->bytes[k] != pattern(n->i, k))
                return "a node of the list from before the bulk changed";
    if (nb != BEFORE_NODES)
        return "the list from before the bulk lost nodes";
    if (st->phase == 1) {
        if (st->load || st->table || st->load_count || bss_marker)
            return "phase 1 with a part of the load";
        return NULL;
    }
    uint64_t count = 0, sum = 0;
    for (node *n = st->load; n; n = n->next) {
        count++;
        sum += n->i * 31 + n->len;
        if (n->len != node_len(n->i))
            return "a loaded node's length";
        for (uint64_t k = 0; k < n->len; k++)
            if (n->bytes[k] != pattern(n->i, k))
                return "a loaded node's bytes";
    }
    if (count != st->load_count || sum != st->load_sum || bss_marker != sum) {
        snprintf(why, sizeof why, "load: %llu nodes sum %llu, recorded %llu / %llu, .bss %llu",
                 (unsigned long long)count, (unsigned long long)sum, (unsigned long long)st->load_count,
                 (unsigned long long)st->load_sum, (unsigned long long)bss_marker);
        return why;
    }
    for (uint64_t k = 0; k < TABLE; k++)
        if (st->table[k] != (k % 4099 == 0 ? pattern(k, 3) : 0))
            return "the load's calloc'ed table";
    return NULL;
}

static const char *probe_problem(void)
{
    if (!st->probe)
        return NULL;
    if (st->probe[0] != 0xAB)
        return "the probe's marker";
    for (uint64_t k = 1; k < PROBE; k++)
        if (st->probe[k]) {
            static char why[96];
            snprintf(why, sizeof why, "the probe (a calloc) has byte %llu = %u after a restart",
                     (unsigned long long)k, st->probe[k]);
            return why;
        }
    return NULL;
}

/* `verify MODE POOL MIN`: recover; the state must be whole, at phase MIN or
 * later. Back at phase 1 for the first time, calloc the probe (it must be
 * zero) for the next verify to check. Exit 0, 1 (wrong), 2 (no pool). */
static int verify_main(const char *mode, const char *pool, uint64_t min_phase)
{
    if (start(pool, mode) != MANGO_RECOVERED)
        return 2;
    const char *why = state_problem(min_phase);
    if (!why)
        why = probe_problem();
    if (why) {
        fprintf(stderr, "verify: %s\n", why);
        return 1;
    }
    printf("verify: phase %llu%s\n", (unsigned long long)st->phase, st->probe ? ", probe zero" : "");
    if (st->phase == 1 && !st->probe) {
        if (mango_batch_begin() != MANGO_OK)
            return 1;
        unsigned char *p = calloc(1, PROBE);
        for (uint64_t k = 0; p && k < PROBE; k++)
            if (p[k]) {
                fprintf(stderr, "verify: a fresh calloc has byte %llu = %u\n", (unsigned long long)k, p[k]);
                return 1;
            }
        if (!p)
            return 1;
        p[0] = 0xAB;
        mango_capture(p, 1);
        st->probe = p;
        mango_capture(&st->probe, sizeof st->probe);
        if (mango_batch_end() != MANGO_OK)
            return 1;
    }
    return mango_shutdown() == MANGO_OK ? 0 : 1;
}

/* Start (fresh or recovered) and make the before batch if it is not there
 * yet: 0, or 1 on failure. */
static int start_with_before(const char *mode, const char *pool)
{
    int s = start(pool, mode);
    if (s != MANGO_FRESH && s != MANGO_RECOVERED)
        return 1;
    return st->phase == 0 ? make_before() : 0;
}

/* `load MODE POOL [submit]`: the before batch (if not there yet), then the
 * load. The kill hook (MANGO_TEST_BULK_KILL_AFTER) may end it. */
static int load_main(const char *mode, const char *pool, bool submit)
{
    if (start_with_before(mode, pool) != 0)
        return 1;
    if (make_load(submit) != 0)
        return 1;
    return mango_shutdown() == MANGO_OK ? 0 : 1;
}

/* `child MODE POOL FD` (kill loop): report 1 once the before batch is
 * durable and 2 once the load is, then idle until killed. */
static int child_main(const char *mode, const char *pool, int fd)
{
    if (start_with_before(mode, pool) != 0)
        return 1;
    uint64_t v = 1;
    if (write(fd, &v, sizeof v) != sizeof v)
        return 1;
    if (st->phase < 2 && make_load(false) != 0)
        return 1;
    v = 2;
    if (write(fd, &v, sizeof v) != sizeof v)
        return 1;
    for (;;)
        pause();
}

static int run_self(const char *a1, const char *a2, const char *a3, const char *a4)
{
    return kill_child_run("test_bulk_load", a1, a2, a3, a4);
}

static void remove_pool(const char *pool)
{
    char big[600];
    snprintf(big, sizeof big, "%s.bigbatch", pool);
    unlink(pool);
    unlink(big);
}

/* The kill loop's first kills can land while the child creates the pool;
 * the next creation removes such a file, the last one is removed here.
 * Returns how many there were. */
static int remove_creation_leftovers(const char *pool)
{
    char pattern[600];
    snprintf(pattern, sizeof pattern, "%s.tmp.*", pool);
    glob_t g;
    if (glob(pattern, 0, NULL, &g) != 0)
        return 0;
    for (size_t i = 0; i < g.gl_pathc; i++)
        unlink(g.gl_pathv[i]);
    int n = (int)g.gl_pathc;
    globfree(&g);
    return n;
}

/* A load killed by the hook at `kill_after` (-1: not killed): what the
 * restarts must find. */
static void kill_point(const char *mode, const char *pool, int kill_after)
{
    remove_pool(pool);
    char n[16];
    snprintf(n, sizeof n, "%d", kill_after);
    if (kill_after >= 0)
        setenv("MANGO_TEST_BULK_KILL_AFTER", n, 1);
    int rc = run_self("load", mode, pool, "-");
    unsetenv("MANGO_TEST_BULK_KILL_AFTER");
    printf("%s, kill after piece %d: load exit %d\n", mode, kill_after, rc);
    CHECK(kill_after >= 0 ? rc == 128 + SIGKILL : rc == 0);
    const char *want = kill_after >= 0 ? "1" : "2";
    CHECK(run_self("verify", mode, pool, want) == 0);
    if (kill_after >= 0) {
        /* The probe: calloc'ed by that verify over the pieces' bytes, still
         * zero after this restart; then the load runs to its end. */
        CHECK(run_self("verify", mode, pool, "1") == 0);
        CHECK(run_self("load", mode, pool, "-") == 0);
        CHECK(run_self("verify", mode, pool, "2") == 0);
    }
}

/* A piece's sync fails (MANGO_FAULT_SYNC at log.commit_sync, the nth sync
 * of the load process there): the bulk end reports it, the batch is dropped,
 * and a restart holds the state of before. */
static void sync_fails(const char *mode, const char *pool, const char *nth)
{
    remove_pool(pool);
    setenv("MANGO_FAULT_SYNC", nth, 1);
    setenv("MANGO_FAULT_SYNC_SITE", "log.commit_sync", 1);
    int rc = run_self("load", mode, pool, "-");
    unsetenv("MANGO_FAULT_SYNC");
    unsetenv("MANGO_FAULT_SYNC_SITE");
    printf("%s, sync %s fails: load exit %d\n", mode, nth, rc);
    CHECK(rc == 1);
    CHECK(run_self("verify", mode, pool, "1") == 0);
    CHECK(run_self("verify", mode, pool, "1") == 0); /* the probe */
    CHECK(run_self("load", mode, pool, "-") == 0);
    CHECK(run_self("verify", mode, pool, "2") == 0);
}

static void misuse(const char *pool)
{
    remove_pool(pool);
    CHECK(mango_batch_bulk_begin() == MANGO_EINVAL); /* before mango_init */
    int s = start(pool, "emulated");
    CHECK(s == MANGO_FRESH);
    if (s != MANGO_FRESH)
        return;
    CHECK(mango_batch_bulk_begin() == MANGO_EINVAL); /* no batch */
    CHECK(mango_batch_bulk_end() == MANGO_EINVAL);
    /* Set outside the batch: setenv allocates, and inside a batch that
     * memory would come from the durable heap, unmapped at the shutdown. */
    setenv("MANGO_TEST_BULK_KILL_AFTER", "2x", 1);
    CHECK(mango_batch_begin() == MANGO_OK);
    CHECK(mango_batch_bulk_end() == MANGO_EINVAL); /* not begun */
    CHECK(mango_batch_pause() == MANGO_OK);
    CHECK(mango_batch_bulk_begin() == MANGO_EINVAL); /* paused */
    CHECK(mango_batch_resume() == MANGO_OK);
    /* A kill hook it cannot read is refused, not taken as "no kill" (a test
     * setting it wrongly would pass without the kill it was written for). */
    CHECK(mango_batch_bulk_begin() == MANGO_EINVAL);
    CHECK(strstr(mango_last_error(), "MANGO_TEST_BULK_KILL_AFTER='2x'") != NULL);
    unsetenv("MANGO_TEST_BULK_KILL_AFTER");
    CHECK(mango_batch_bulk_begin() == MANGO_OK);
    CHECK(mango_batch_bulk_begin() == MANGO_EINVAL); /* twice */
    /* Ends with the batch (no bulk_end): the heap stores are still logged. */
    st->phase = 7;
    CHECK(mango_batch_end() == MANGO_OK);
    CHECK(mango_batch_bulk_end() == MANGO_EINVAL); /* the batch is gone */
    CHECK(mango_shutdown() == MANGO_OK);
    CHECK(run_self("verify", "emulated", pool, "0") == 1); /* phase 7 is no valid phase ... */
    s = start(pool, "emulated");
    CHECK(s == MANGO_RECOVERED && st->phase == 7); /* ... but it was kept */
    CHECK(mango_shutdown() == MANGO_OK);
}

static void kill_loop(const char *pool, int rounds)
{
    int found[3] = {0, 0, 0}; /* recovered at phase 0 (nothing acknowledged yet), 1, 2 */
    for (int r = 0; r < rounds; r++) {
        remove_pool(pool);
        uint64_t acked = 0;
        CHECK(kill_child_round("test_bulk_load", "sim", pool, 1, 120, &acked));
        char min[8];
        snprintf(min, sizeof min, "%llu", (unsigned long long)acked);
        int v = run_self("verify-phase", "sim", pool, min);
        if (v == 2 && acked == 0)
            continue; /* killed before the pool was made */
        if (v != 21 && v != 22 && !(v == 20 && acked == 0))
            fprintf(stderr, "kill loop round %d: verify-phase exit %d (acked %llu)\n", r, v,
                    (unsigned long long)acked);
        CHECK(v == 21 || v == 22 || (v == 20 && acked == 0));
        if (v >= 20 && v <= 22)
            found[v - 20]++;
        if (v == 21) /* the probe, calloc'ed over the pieces' bytes */
            CHECK(run_self("verify", "sim", pool, "1") == 0);
    }
    printf("sim kill loop: %d rounds, recovered empty %d, before the load %d, after it %d\n", rounds, found[0],
           found[1], found[2]);
}

int main(int argc, char **argv)
{
    if (argc >= 5 && strcmp(argv[1], "child") == 0)
        return child_main(argv[2], argv[3], atoi(argv[4]));
    if (argc >= 4 && strcmp(argv[1], "load") == 0)
        return load_main(argv[2], argv[3], argc >= 5 && strcmp(argv[4], "submit") == 0);
    if (argc >= 5 && strcmp(argv[1], "verify") == 0)
        return verify_main(argv[2], argv[3], strtoull(argv[4], NULL, 10));
    if (argc >= 5 && strcmp(argv[1], "verify-phase") == 0) { /* as verify, 20 + phase for 0 */
        int rc = verify_main(argv[2], argv[3], strtoull(argv[4], NULL, 10));
        return rc == 0 ? 20 + (int)st->phase : rc;
    }
    char pool[512];
    snprintf(pool, sizeof pool, "/tmp/mango_test_bulk_load_%d.pool", (int)getpid());
    srand((unsigned)getpid());

    misuse(pool);
    kill_point("emulated", pool, -1);
    kill_point("emulated", pool, 0);
    kill_point("emulated", pool, 1);
    kill_point("emulated", pool, 2);
    kill_point("sim", pool, 1);
    kill_point("sim", pool, 9);
    kill_point("fs", pool, -1);
    kill_point("fs", pool, 3);
    /* Ended by mango_batch_submit (no bulk_end; pipelined in fs and sim
     * modes) and its ticket waited for: the load is there after a restart. */
    remove_pool(pool);
    CHECK(run_self("load", "fs", pool, "submit") == 0);
    CHECK(run_self("verify", "fs", pool, "2") == 0);
    remove_pool(pool);
    CHECK(run_self("load", "sim", pool, "submit") == 0);
    CHECK(run_self("verify", "sim", pool, "2") == 0);
    sync_fails("emulated", pool, "6");
    sync_fails("sim", pool, "3");
    kill_loop(pool, 16);
    remove_pool(pool);
    /* At most the last round's: every creation removes those of dead
     * processes (pool.c), so the rounds before it left nothing. */
    CHECK(remove_creation_leftovers(pool) <= 1);
    return check_report("test_bulk_load");
}
