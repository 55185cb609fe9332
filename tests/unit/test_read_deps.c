/* test_read_deps.c -- reads wait only for their keys (read_deps.h and
 * mango_callbacks.request_keys):
 *   - the table alone: a published ticket lands on the batch's keys only;
 *     a write without keys, an exclusive batch or a batch of more keys than
 *     the pending list holds count for every key; a failed batch (ticket 0)
 *     publishes nothing;
 *   - the runtime in sim mode with every sync slowed to 300 ms: while a PUT
 *     of key 1 is in flight, a GET of another key answers before that PUT is
 *     durable, and a GET of key 1 answers only after it is; while a write
 *     without keys is in flight, every GET waits for it, and so does a read
 *     without keys; request_keys results out of bounds (-5, more than max)
 *     count as without keys; an exclusive batch (mango_batch_submit) in
 *     flight makes every read wait;
 *   - in a child whose first sync on the sync thread fails: a GET of another
 *     key answers, a GET of the failed PUT's key and the PUT are refused,
 *     and so is everything after.
 * The runtime cases need the PUT's batch handed to the sync thread, which
 * local mode does while readers wait for the lock: a thread keeps reading
 * meanwhile, and a case is retried until its batch went that way. That
 * thread's reads also check that read-only commands note no keys: the first
 * version ran them through the same wrapper as writes, and their keys,
 * noted by a thread outside the batch, made batches count as unkeyed. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "concurrency/read_deps.h"
#include "mango.h"

#include "check.h"
#include "test_config.h"

/* ---- the table alone ---------------------------------------------------- */

static uint64_t target1(read_deps *d, uint64_t key) { return read_deps_target(d, &key, 1); }

static void table_cases(void)
{
    static read_deps d;
    read_deps_init(&d);
    CHECK(target1(&d, 1) == 0);
    CHECK(read_deps_target(&d, NULL, 0) == 0);

    uint64_t k12[] = {1, 2};
    read_deps_note_write(&d, k12, 2);
    read_deps_publish(&d, 5, false);
    CHECK(target1(&d, 1) == 5);
    CHECK(target1(&d, 2) == 5);
    CHECK(target1(&d, 3) == 0);
    CHECK(read_deps_target(&d, k12, 2) == 5);

    /* A write that names no keys at all (n == 0) changes nothing readable. */
    read_deps_note_write(&d, NULL, 0);
    read_deps_publish(&d, 6, false);
    CHECK(target1(&d, 3) == 0 && target1(&d, 1) == 5);

    /* A later batch on key 2 only. */
    uint64_t k2 = 2;
    read_deps_note_write(&d, &k2, 1);
    read_deps_publish(&d, 7, false);
    CHECK(target1(&d, 1) == 5 && target1(&d, 2) == 7);
    uint64_t k123[] = {1, 2, 3};
    CHECK(read_deps_target(&d, k123, 3) == 7);

    /* A failed batch publishes nothing and leaves nothing pending. */
    uint64_t k3 = 3;
    read_deps_note_write(&d, &k3, 1);
    read_deps_publish(&d, 0, false);
    CHECK(target1(&d, 3) == 0);
    read_deps_publish(&d, 8, false);
    CHECK(target1(&d, 3) == 0);

    /* One command without keys makes the whole batch count for every key. */
    read_deps_note_write(&d, &k3, 1);
    read_deps_note_write(&d, NULL, -1);
    read_deps_publish(&d, 9, false);
    CHECK(target1(&d, 4) == 9 && target1(&d, 1) == 9 && read_deps_target(&d, NULL, 0) == 9);

    /* An exclusive batch (mango_batch_*, init_state) too. */
    read_deps_publish(&d, 10, true);
    CHECK(target1(&d, 12345) == 10);

    /* More keys than the pending list holds: unkeyed. */
    static read_deps e;
    read_deps_init(&e);
    for (uint64_t k = 0; k <= READ_DEPS_PENDING; k++)
        read_deps_note_write(&e, &k, 1);
    read_deps_publish(&e, 11, false);
    CHECK(target1(&e, 999999) == 11);

    /* Many distinct keys: no two of 1..64 share a slot (small consecutive
     * keys, array indexes, must not collide). */
    static read_deps f;
    read_deps_init(&f);
    for (uint64_t k = 1; k <= 64; k++) {
        read_deps_note_write(&f, &k, 1);
        read_deps_publish(&f, k, false);
    }
    int distinct = 1;
    for (uint64_t k = 1; k <= 64; k++)
        distinct &= target1(&f, k) == k;
    CHECK(distinct);
}

/* ---- the runtime -------------------------------------------------------- */

#define N_KEYS 16
static uint64_t *values; /* durable */

typedef struct cmd {
    char op;      /* 'G' get, 'P' put, 'U' put without keys, 'S' sum (a read without keys);
                   * 'g' and 'u': a get and a put whose request_keys breaks the rules
                   * (returns more than max, or -5): they count as without keys */
    uint32_t key;
    uint64_t value, out;
} cmd;

static void init_state(void *arg)
{
    (void)arg;
    values = calloc(N_KEYS, sizeof *values);
    mango_capture(&values, sizeof values);
    mango_capture(values, N_KEYS * sizeof *values);
}

static bool is_ro(void *c)
{
    char op = ((cmd *)c)->op;
    return op == 'G' || op == 'S' || op == 'g';
}

static void process(void *arg)
{
    cmd *c = arg;
    switch (c->op) {
    case 'G':
    case 'g':
        c->out = values[c->key];
        break;
    case 'S':
        c->out = 0;
        for (int i = 0; i < N_KEYS; i++)
            c->out += values[i];
        break;
    default:
        values[c->key] = c->value;
        mango_capture(&values[c->key], sizeof *values);
    }
}

static int request_keys(void *arg, uint64_t *keys, unsigned max)
{
    cmd *c = arg;
    if (c->op == 'U' || c->op == 'S' || max < 1)
        return -1;
    keys[0] = c->key;
    if (c->op == 'g')
        return (int)max + 1; /* more than it may store: counts as -1 */
    if (c->op == 'u')
        return -5;
    return 1;
}

static _Atomic bool stop_reading;

/* Keeps reading key 15, so that a writer's batch finds readers waiting for
 * the lock and is handed to the sync thread. */
static void *reader_main(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop_reading)) {
        cmd g = {.op = 'G', .key = 15};
        if (mango_client_cmd(&g) != MANGO_OK)
            break;
    }
    return NULL;
}

static void *writer_main(void *arg)
{
    cmd *c = arg;
    intptr_t rc = mango_client_cmd(c);
    return (void *)rc;
}

static uint64_t durable_now(void)
{
    uint64_t d = 0;
    mango_durable_ticket(&d);
    return d;
}

/* Starts c on a writer thread and waits until its batch is in flight (sealed,
 * not yet durable). false if it was committed inline instead (the caller
 * retries): it then returns after the slowed sync. */
static bool start_in_flight(cmd *c, pthread_t *t)
{
    pthread_create(t, NULL, writer_main, c);
    for (int i = 0; i < 2000; i++) {
        mango_stats s;
        mango_get_stats(&s);
        if (s.batches_in_flight > 0)
            return true;
        usleep(100);
    }
    return false;
}

/* One read while the write is in flight: its value, and whether it answered
 * before the write was durable. */
static bool read_before_durable(cmd *r, uint64_t in_flight)
{
    int rc = mango_client_cmd(r);
    CHECK(rc == MANGO_OK);
    return durable_now() < in_flight;
}

/* Runs a write (op, key) on a writer thread until its batch goes to the sync
 * thread (retried with value + attempt when it was synced inline instead),
 * and calls check(&write, in_flight ticket) while it is in flight. The write
 * must then return OK, or fail (fails: the fault case). Returns whether
 * check ran. */
typedef void in_flight_check(const cmd *write, uint64_t in_flight);

static bool while_in_flight(char op, uint32_t key, uint64_t value, in_flight_check *check, bool fails)
{
    for (int attempt = 0; attempt < 20; attempt++) {
        cmd write = {.op = op, .key = key, .value = value + (uint64_t)attempt};
        pthread_t w;
        bool flying = start_in_flight(&write, &w);
        if (flying)
            check(&write, mango_reply_ticket()); /* the last ticket handed out: this write's */
        void *rc;
        pthread_join(w, &rc);
        /* Synced inline (not flying), it returns once durable, as it must. */
        CHECK(flying && fails ? (intptr_t)rc < 0 : (intptr_t)rc == MANGO_OK);
        if (flying)
            return true;
    }
    return false;
}

/* A keyed PUT in flight: other keys answer at once, its key waits. */
static void other_key_answers_same_key_waits(const cmd *put, uint64_t in_flight)
{
    cmd other = {.op = 'G', .key = 2};
    CHECK(read_before_durable(&other, in_flight)); /* did not wait for the PUT */
    cmd same = {.op = 'G', .key = put->key};
    bool early = read_before_durable(&same, in_flight);
    CHECK(same.out == put->value); /* it saw the PUT ... */
    CHECK(!early);                 /* ... so it answered only once that was durable */
}

static void get_waits(const cmd *put, uint64_t in_flight)
{
    (void)put;
    cmd other = {.op = 'G', .key = 2};
    CHECK(!read_before_durable(&other, in_flight));
}

static void bad_get_waits(const cmd *put, uint64_t in_flight)
{
    (void)put;
    cmd other = {.op = 'g', .key = 2};
    CHECK(!read_before_durable(&other, in_flight));
}

static void sum_waits(const cmd *put, uint64_t in_flight)
{
    (void)put;
    cmd sum = {.op = 'S'};
    CHECK(!read_before_durable(&sum, in_flight));
}

/* A new pool in sim mode, every sync slowed to 300 ms, with request_keys. */
static int start_keyed(const char *pool)
{
    setenv("MANGO_SIM_SYNC_DELAY_US", "300000", 1);
    mango_config cfg;
    small_test_config(&cfg, pool, MANGO_PERSIST_SIM);
    mango_callbacks cb = {.is_read_only = is_ro, .process_request = process, .init_state = init_state,
                          .request_keys = request_keys};
    unlink(pool);
    return mango_init(&cfg, &cb);
}

static int runtime_cases(const char *pool)
{
    int st = start_keyed(pool);
    CHECK(st == MANGO_FRESH);
    if (st < 0) {
        fprintf(stderr, "mango_init: %s\n", mango_last_error());
        return 1;
    }
    pthread_t reader;
    pthread_create(&reader, NULL, reader_main, NULL);

    CHECK(while_in_flight('P', 1, 100, other_key_answers_same_key_waits, false));
    /* A PUT whose request_keys returns -5 counts as without keys; a GET
     * whose request_keys returns more than max waits for everything. */
    CHECK(while_in_flight('u', 6, 400, get_waits, false));
    CHECK(while_in_flight('P', 7, 500, bad_get_waits, false));

    /* An exclusive batch (mango_batch_submit) in flight counts as writing
     * every key: reads of other keys wait for it too. */
    CHECK(mango_batch_begin() == MANGO_OK);
    values[8] = 600;
    mango_capture(&values[8], sizeof *values);
    uint64_t span_ticket = 0;
    CHECK(mango_batch_submit(&span_ticket) == MANGO_OK);
    CHECK(durable_now() < span_ticket); /* 300 ms syncs: still in flight */
    cmd after_span = {.op = 'G', .key = 2};
    CHECK(!read_before_durable(&after_span, span_ticket));

    /* A PUT without keys in flight: every read waits for it. */
    CHECK(while_in_flight('U', 3, 200, get_waits, false));
    /* A read without keys waits for a keyed PUT in flight. */
    CHECK(while_in_flight('P', 4, 300, sum_waits, false));

    /* mango_client_submit: a PUT returns before it is durable, with the
     * ticket its response waits for; a GET of another key names an earlier
     * ticket, a GET of the PUT's key the PUT's own. */
    cmd sput = {.op = 'P', .key = 9, .value = 900};
    uint64_t t_put = 0, t_other = 0, t_same = 0;
    CHECK(mango_client_submit(&sput, &t_put) == MANGO_OK);
    CHECK(t_put > 0 && durable_now() < t_put); /* its batch went to the sync thread */
    cmd sother = {.op = 'G', .key = 10};
    CHECK(mango_client_submit(&sother, &t_other) == MANGO_OK && t_other < t_put);
    cmd ssame = {.op = 'G', .key = 9};
    CHECK(mango_client_submit(&ssame, &t_same) == MANGO_OK && ssame.out == 900 && t_same == t_put);
    CHECK(mango_client_submit(&ssame, NULL) == MANGO_EINVAL);
    CHECK(mango_wait_durable(t_put) == MANGO_OK && durable_now() >= t_put);

    mango_stats s;
    mango_get_stats(&s);
    CHECK(s.reads_waited >= 6); /* those the cases above expect to wait, at least */
    printf("reads that waited for a sync: %llu\n", (unsigned long long)s.reads_waited);

    atomic_store(&stop_reading, true);
    pthread_join(reader, NULL);
    CHECK(mango_shutdown() == MANGO_OK);
    unlink(pool);
    return 0;
}

/* The fault case's check: the PUT's sync fails after 300 ms. */
static void other_key_answers_same_key_refused(const cmd *put, uint64_t in_flight)
{
    cmd other = {.op = 'G', .key = 2};
    int rc_other = mango_client_cmd(&other);
    CHECK(rc_other == MANGO_OK && durable_now() < in_flight); /* answered, before the failure */
    cmd same = {.op = 'G', .key = put->key};
    CHECK(mango_client_cmd(&same) < 0); /* it read the PUT, which never became durable */
}

/* Child process (`test_read_deps fault POOL`, started by main with
 * MANGO_FAULT_SYNC_SITE=log.pipeline_sync MANGO_FAULT_SYNC=1): the first sync
 * of the sync thread fails. A keyed PUT in flight then never becomes
 * durable: a GET of another key answers (it read nothing of it), a GET of the
 * PUT's key is refused, the PUT is refused, and so is every command after
 * it. Exit 0 if all of that held. */
static int fault_case(const char *pool)
{
    if (start_keyed(pool) != MANGO_FRESH) {
        fprintf(stderr, "fault: mango_init: %s\n", mango_last_error());
        return 2;
    }
    pthread_t reader;
    pthread_create(&reader, NULL, reader_main, NULL);
    CHECK(while_in_flight('P', 1, 700, other_key_answers_same_key_refused, true));
    atomic_store(&stop_reading, true);
    pthread_join(reader, NULL);
    cmd later = {.op = 'G', .key = 3};
    CHECK(mango_client_cmd(&later) < 0); /* the runtime stopped: nothing more is answered */
    mango_shutdown();
    unlink(pool);
    return check_report("test_read_deps fault");
}

int main(int argc, char **argv)
{
    char pool[64];
    snprintf(pool, sizeof pool, "/dev/shm/mango-test-read-deps-%d.pool", (int)getpid());
    if (argc == 3 && strcmp(argv[1], "fault") == 0)
        return fault_case(argv[2]);
    table_cases();
    runtime_cases(pool);
    /* The failed-sync case runs in a child: the fault stops the runtime. */
    pid_t pid = fork();
    if (pid == 0) {
        setenv("MANGO_FAULT_SYNC_SITE", "log.pipeline_sync", 1);
        setenv("MANGO_FAULT_SYNC", "1", 1);
        execl("/proc/self/exe", argv[0], "fault", pool, (char *)NULL);
        _exit(127);
    }
    int ws = 0;
    waitpid(pid, &ws, 0);
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    return check_report("test_read_deps");
}
