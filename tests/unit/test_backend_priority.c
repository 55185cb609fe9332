/* test_backend_priority.c -- the backend thread's scheduling (backend.h):
 *   - bad MANGO_BACKEND_PRIORITY / backend_priority values are refused;
 *   - 'normal' keeps the thread SCHED_OTHER;
 *   - 'auto', where the process may raise a thread out of SCHED_IDLE, runs it
 *     SCHED_IDLE; with every CPU busy and the log full, the frontend raises it
 *     (observed on the thread itself), and it lowers itself once caught up.
 *     Where raising is not permitted, 'auto' keeps it normal and 'idle' fails;
 *   - fs mode: a round that a quarter of the log started runs at idle
 *     priority (no boost) while less than half of the log waits. */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "mango.h"

#include "check.h"
#include "test_config.h"

#define BUF_BYTES (64u << 10)
#include "durable_buffer.h"
#define WRITE_BYTES (8u << 10)

static unsigned turn;

static bool is_ro(void *c) { (void)c; return false; }
static void write_chunk(void *c)
{
    (void)c;
    turn++;
    write_slot(turn - 1, WRITE_BYTES, (int)turn);
}

static char pool_path[64];

static int start_in(mango_backend_priority prio, const char *path, mango_persist_mode mode)
{
    mango_config cfg;
    small_test_config(&cfg, path, mode);
    cfg.backend_priority = prio;
    mango_callbacks cb = {.is_read_only = is_ro, .process_request = write_chunk, .init_state = init_state};
    return mango_init(&cfg, &cb);
}

static int start(mango_backend_priority prio) { return start_in(prio, pool_path, MANGO_PERSIST_EMULATED); }

/* The tid of this process's thread named name, or 0. */
static pid_t find_thread_once(const char *name)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return 0;
    pid_t found = 0;
    struct dirent *e;
    while (!found && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[96], comm[32] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        if (fgets(comm, sizeof comm, f))
            comm[strcspn(comm, "\n")] = 0;
        fclose(f);
        if (strcmp(comm, name) == 0)
            found = (pid_t)atoi(e->d_name);
    }
    closedir(d);
    return found;
}

static int policy_of(pid_t tid) { return tid > 0 ? sched_getscheduler(tid) : -1; }

static void sleep_ms(unsigned ms)
{
    struct timespec t = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* The thread names itself when it starts: wait up to 5 s for it. */
static pid_t find_thread(const char *name)
{
    for (int i = 0; i < 500; i++) {
        pid_t t = find_thread_once(name);
        if (t)
            return t;
        sleep_ms(10);
    }
    return 0;
}

/* Wait up to 10 s for the thread's policy to become want. */
static bool await_policy(pid_t tid, int want)
{
    for (int i = 0; i < 1000; i++) {
        if (policy_of(tid) == want)
            return true;
        sleep_ms(10);
    }
    return false;
}

/* Same question as the runtime asks, of a throwaway thread. */
static void *probe_main(void *arg)
{
    struct sched_param sp = {0};
    *(bool *)arg = pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp) == 0 &&
                   pthread_setschedparam(pthread_self(), SCHED_OTHER, &sp) == 0;
    return NULL;
}

static atomic_bool hog_stop, watch_stop;
static atomic_int saw_other;

static void *hog_main(void *arg)
{
    (void)arg;
    volatile uint64_t x = 0;
    while (!atomic_load_explicit(&hog_stop, memory_order_relaxed))
        x++;
    return NULL;
}

static void *watch_main(void *arg)
{
    pid_t tid = *(pid_t *)arg;
    while (!atomic_load(&watch_stop)) {
        if (policy_of(tid) == SCHED_OTHER)
            atomic_store(&saw_other, 1);
        usleep(100);
    }
    return NULL;
}

int main(void)
{
    snprintf(pool_path, sizeof pool_path, "/dev/shm/mango-bprio-%d.pool", (int)getpid());
    unsetenv("MANGO_BACKEND_PRIORITY");

    /* Bad values are refused, with the variable named. */
    setenv("MANGO_BACKEND_PRIORITY", "lowest", 1);
    CHECK(start(MANGO_BACKEND_PRIORITY_AUTO) == MANGO_EINVAL);
    CHECK(strstr(mango_last_error(), "MANGO_BACKEND_PRIORITY=lowest") != NULL);
    unsetenv("MANGO_BACKEND_PRIORITY");
    CHECK(start((mango_backend_priority)42) == MANGO_EINVAL);
    CHECK(strstr(mango_last_error(), "backend_priority") != NULL);

    /* normal: SCHED_OTHER, not lowered. */
    unlink(pool_path);
    CHECK(start(MANGO_BACKEND_PRIORITY_NORMAL) == MANGO_FRESH);
    pid_t tid = find_thread("mango-backend");
    CHECK(tid > 0);
    sleep_ms(50);
    CHECK(policy_of(tid) == SCHED_OTHER);
    mango_stats st;
    mango_get_stats(&st);
    CHECK(st.backend_lowered == 0);
    CHECK(mango_shutdown() == 0);

    /* The environment overrides the configuration. */
    setenv("MANGO_BACKEND_PRIORITY", "normal", 1);
    unlink(pool_path);
    CHECK(start(MANGO_BACKEND_PRIORITY_AUTO) == MANGO_FRESH);
    mango_get_stats(&st);
    CHECK(st.backend_lowered == 0);
    CHECK(mango_shutdown() == 0);
    unsetenv("MANGO_BACKEND_PRIORITY");

    bool permitted = false;
    pthread_t pt;
    CHECK(pthread_create(&pt, NULL, probe_main, &permitted) == 0);
    pthread_join(pt, NULL);
    printf("raising a thread out of SCHED_IDLE is %spermitted here\n", permitted ? "" : "NOT ");

    if (!permitted) {
        unlink(pool_path);
        CHECK(start(MANGO_BACKEND_PRIORITY_AUTO) == MANGO_FRESH);
        mango_get_stats(&st);
        CHECK(st.backend_lowered == 0);
        CHECK(mango_shutdown() == 0);
        CHECK(start(MANGO_BACKEND_PRIORITY_IDLE) == MANGO_EINVAL);
        unlink(pool_path);
        return check_report("test_backend_priority");
    }

    /* auto: SCHED_IDLE from the start. */
    unlink(pool_path);
    CHECK(start(MANGO_BACKEND_PRIORITY_AUTO) == MANGO_FRESH);
    tid = find_thread("mango-backend");
    CHECK(tid > 0);
    CHECK(await_policy(tid, SCHED_IDLE));
    mango_get_stats(&st);
    CHECK(st.backend_lowered == 1);
    uint64_t boosts0 = st.backend_boosts;

    /* Every CPU busy (two normal-priority spinners per CPU) and a writer that
     * fills the 1 MiB log every ~120 batches: the lowered backend gets no CPU
     * time of its own, so the writer must raise it to get log space back. */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu < 1)
        ncpu = 1;
    if (ncpu > 16)
        ncpu = 16;
    pthread_t hogs[32], watcher;
    unsigned nhogs = (unsigned)(2 * ncpu);
    for (unsigned i = 0; i < nhogs; i++)
        CHECK(pthread_create(&hogs[i], NULL, hog_main, NULL) == 0);
    CHECK(pthread_create(&watcher, NULL, watch_main, &tid) == 0);
    int x = 0;
    for (int i = 0; i < 3000; i++)
        if (mango_client_cmd(&x) != 0) {
            CHECK(!"mango_client_cmd failed");
            break;
        }
    atomic_store(&hog_stop, true);
    for (unsigned i = 0; i < nhogs; i++)
        pthread_join(hogs[i], NULL);
    atomic_store(&watch_stop, true);
    pthread_join(watcher, NULL);
    mango_get_stats(&st);
    printf("auto, busy CPUs: boosts=%llu log_full_waits=%llu saw SCHED_OTHER=%d\n",
           (unsigned long long)(st.backend_boosts - boosts0), (unsigned long long)st.log_full_waits,
           atomic_load(&saw_other));
    CHECK(st.backend_boosts > boosts0);
    CHECK(atomic_load(&saw_other) == 1);
    /* Caught up: it lowers itself again. */
    CHECK(await_policy(tid, SCHED_IDLE));
    CHECK(mango_shutdown() == 0);

    /* The state survived all of it. */
    CHECK(start(MANGO_BACKEND_PRIORITY_AUTO) == MANGO_RECOVERED);
    unsigned last = (turn - 1) * WRITE_BYTES % BUF_BYTES;
    CHECK(turn == 3000);
    CHECK(buf[last] == (unsigned char)turn && buf[last + WRITE_BYTES - 1] == (unsigned char)turn);
    CHECK(mango_shutdown() == 0);
    unlink(pool_path);

    /* fs mode (a pool on disk, 1 MiB log): the frontend wakes the backend
     * at a quarter of the log but raises it only at half. Write a little
     * past a quarter, then wait for the round: it runs SCHED_IDLE throughout
     * (the CPUs are otherwise idle), and no boost is counted. */
    char fs_path[512];
    const char *tmp = getenv("TMPDIR");
    snprintf(fs_path, sizeof fs_path, "%s/mango-bprio-fs-%d.pool", tmp && *tmp ? tmp : "/var/tmp",
             (int)getpid());
    unlink(fs_path);
    turn = 0;
    CHECK(start_in(MANGO_BACKEND_PRIORITY_AUTO, fs_path, MANGO_PERSIST_FS) == MANGO_FRESH);
    tid = find_thread("mango-backend");
    CHECK(tid > 0);
    CHECK(await_policy(tid, SCHED_IDLE));
    mango_get_stats(&st);
    uint64_t log0 = st.log_bytes, boosts_fs0 = st.backend_boosts, bsyncs0 = st.backend_syncs;
    atomic_store(&saw_other, 0);
    atomic_store(&watch_stop, false);
    CHECK(pthread_create(&watcher, NULL, watch_main, &tid) == 0);
    const uint64_t quarter = (1u << 20) / 4, half = (1u << 20) / 2;
    while (st.log_bytes - log0 < quarter + quarter / 4) {
        if (mango_client_cmd(&x) != 0) {
            CHECK(!"mango_client_cmd failed (fs)");
            break;
        }
        mango_get_stats(&st);
    }
    uint64_t written = st.log_bytes - log0;
    for (int i = 0; i < 1500 && st.backend_syncs == bsyncs0; i++) { /* up to 15 s */
        sleep_ms(10);
        mango_get_stats(&st);
    }
    atomic_store(&watch_stop, true);
    pthread_join(watcher, NULL);
    printf("fs, %llu KiB of a 1 MiB log: backend syncs +%llu, boosts +%llu, saw SCHED_OTHER=%d\n",
           (unsigned long long)(written >> 10), (unsigned long long)(st.backend_syncs - bsyncs0),
           (unsigned long long)(st.backend_boosts - boosts_fs0), atomic_load(&saw_other));
    CHECK(written >= quarter && written < half);
    CHECK(st.backend_syncs > bsyncs0);           /* the round ran */
    CHECK(st.backend_boosts == boosts_fs0);      /* without a boost */
    CHECK(atomic_load(&saw_other) == 0);
    CHECK(policy_of(tid) == SCHED_IDLE);
    CHECK(mango_shutdown() == 0);
    unlink(fs_path);
    return check_report("test_backend_priority");
}
