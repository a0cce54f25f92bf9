/* How long this process was stopped while a capture runs: a thread that sleeps in short slices and
 * adds up how late it wakes. A stopped process (SIGSTOP, a frozen cgroup, a paused container)
 * cannot run any of its threads, so this one wakes late by the stop, whatever the training thread
 * was doing then; its own wait in the run queue, which the agent reads from its schedstat, is the
 * part of that lateness that the CPUs being busy explains. Loaded by schedstat.py with ctypes; a
 * plain C library (no Python headers), so that any training image's interpreter can load it. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static volatile int running;
static volatile int64_t late_ns, tid;
static int64_t slice_ns;
static pthread_t thread;
static pid_t owner; /* a child forked meanwhile has no such thread to stop */

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void *watch(void *unused) {
    (void)unused;
    /* Signals are the training's: none is delivered here. SIGSTOP cannot be blocked. */
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    /* Without slack the timer wakes it on time (the default 50 us would count as lateness). */
    prctl(PR_SET_TIMERSLACK, 1UL);
    /* Named, so that top and /proc say whose it is. */
    prctl(PR_SET_NAME, "stepscope-stops");
    __atomic_store_n(&tid, (int64_t)syscall(SYS_gettid), __ATOMIC_RELEASE);
    /* A stop interrupts the sleep; the kernel restarts it with the same deadline, so the wake-up is
     * late by what of the stop falls after that deadline: nearly all of it for slices this short. */
    struct timespec slice = {0, slice_ns};
    while (__atomic_load_n(&running, __ATOMIC_ACQUIRE)) {
        int64_t before = now_ns();
        nanosleep(&slice, NULL);
        int64_t over = now_ns() - before - slice_ns;
        if (over > 0) __atomic_add_fetch(&late_ns, over, __ATOMIC_RELAXED);
    }
    return NULL;
}

/* Starts the thread (slices of `slice` ns, under 1 s); its kernel thread id, or -1. */
int64_t stop_watch_start(int64_t slice) {
    /* Running in this process already; in a child forked meanwhile the flag is the parent's. */
    if ((__atomic_load_n(&running, __ATOMIC_ACQUIRE) && owner == getpid()) || slice <= 0 || slice >= 1000000000)
        return -1;
    slice_ns = slice;
    owner = getpid();
    late_ns = 0;
    tid = 0;
    __atomic_store_n(&running, 1, __ATOMIC_RELEASE);
    if (pthread_create(&thread, NULL, watch, NULL) != 0) {
        running = 0;
        return -1;
    }
    while (!__atomic_load_n(&tid, __ATOMIC_ACQUIRE)) usleep(50);
    return tid;
}

/* The lateness added up since the start, in ns. */
int64_t stop_watch_late_ns(void) { return __atomic_load_n(&late_ns, __ATOMIC_RELAXED); }

void stop_watch_stop(void) {
    if (!__atomic_load_n(&running, __ATOMIC_ACQUIRE)) return;
    __atomic_store_n(&running, 0, __ATOMIC_RELEASE);
    if (getpid() == owner) pthread_join(thread, NULL);
}
