/* The NVML sampler's native fast tier (stepscope.sidecar.nvml.native loads it with ctypes).

   Why native: at 1 ms on a node of 8 GPUs the Python round costs 3-7 us per GPU on cold caches,
   on top of the wake-up, which puts the sampler at 6-9 % of a core on a VM; this loop costs the
   wake-up and well under a microsecond per GPU. It knows nothing of Python: it calls the NVML
   functions it is given (the real libnvidia-ml's, or a simulation's) for every GPU at
   every deadline, adds power, temperature and memory used every slow_period_ns, and writes one
   row of doubles per GPU into a ring that Python allocated and reads once the thread has
   stopped. Python keeps what queues up in the driver (utilization buffers, XID events) and
   polled utilization. Nothing here allocates, and one thread owns the ring until ss_stop().

   Build: cc -O2 -shared -fPIC -o sidecar/nvml/_fast_sampler.so sidecar/nvml/fast_sampler.c -lpthread
   (the Makefile and the Dockerfile do it; without the library the sampler runs in Python). */
#include <math.h>
#include <pthread.h>

#include "nvml_abi.h"

enum { READ_CLOCKS, READ_REASONS, READ_FIELDS, READ_POWER, READ_TEMPERATURE, READ_MEMORY, READS };
enum { MAX_LATE_WAKE_NS = 150000 };

typedef int (*clock_info_fn)(void *device, unsigned int type, unsigned int *mhz);
typedef int (*reasons_fn)(void *device, unsigned long long *reasons);
typedef int (*field_values_fn)(void *device, int count, field_value_t *values);
typedef int (*power_fn)(void *device, unsigned int *milliwatts);
typedef int (*temperature_fn)(void *device, unsigned int sensor, unsigned int *celsius);
typedef int (*memory_fn)(void *device, memory_t *memory);

typedef struct {
    void *device;            /* nvmlDevice_t */
    double label;            /* the row's gpu column */
    field_value_t *fields;   /* n_fields entries, ids and scopes set by Python, filled here */
    int unsupported;         /* bit per READ_*: the device refused it for good, it is not asked again */
} gpu_t;

typedef struct {
    clock_info_fn clock_info;
    reasons_fn reasons;
    field_values_fn field_values;
    power_fn power;
    temperature_fn temperature;
    memory_fn memory;
    gpu_t *gpus;
    int n_gpus, n_fields;
    int64_t interval_ns;
    int64_t epoch_offset_ns; /* Unix ns - CLOCK_MONOTONIC ns, measured by Python */
    int64_t spin_below_ns;   /* shorter intervals spin the last stretch before each deadline */
    int64_t slow_period_ns;  /* power, temperature and memory used, in the round of every such period */
    int64_t fields_every;    /* the field values in every such round only (the call can cost 100s of us) */
    double *ring;
    int64_t row_doubles, capacity;
    int col_clocks;          /* SM clock, memory clock, clock-event reasons in three columns from here */
    int col_fields;          /* the field values in n_fields columns from here */
    int col_slow;            /* power (W), temperature (C), memory used (MiB) in three columns from here */
    volatile int stop;
    int64_t rows, rounds, dropped;
    double cpu_s, wall_s;
    int64_t errors[READS];
    pthread_t thread;
} sampler_t;

static void sleep_until(int64_t deadline_ns) {
    struct timespec t = {deadline_ns / 1000000000, deadline_ns % 1000000000};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) != 0) {
    }
}

static double field_as_double(const field_value_t *v) {
    switch (v->valueType) { /* nvmlValueType_t */
    case 0: return v->value.d;
    case 1: return v->value.ui;
    case 2: return (double)v->value.ul;
    case 3: return (double)v->value.ull;
    case 4: return (double)v->value.sll;
    case 5: return v->value.si;
    case 6: return v->value.us;
    default: return v->value.ui;
    }
}

/* 1 when the read failed: counted, or never asked again when the device does not support it. */
static int failed(sampler_t *s, gpu_t *g, int result, int read) {
    if (result == NVML_SUCCESS)
        return 0;
    if (result == NVML_ERROR_NOT_SUPPORTED || result == NVML_ERROR_FUNCTION_NOT_FOUND)
        g->unsupported |= 1 << read;
    else
        s->errors[read]++;
    return 1;
}

static int readable(const gpu_t *g, int read) { return !(g->unsupported & 1 << read); }

static void slow_reads(sampler_t *s, gpu_t *g, double *row) {
    unsigned int milliwatts = 0, celsius = 0;
    memory_t memory = {0, 0, 0};
    if (readable(g, READ_POWER) && !failed(s, g, s->power(g->device, &milliwatts), READ_POWER))
        row[s->col_slow] = milliwatts / 1000.0;
    if (readable(g, READ_TEMPERATURE) && !failed(s, g, s->temperature(g->device, NVML_TEMPERATURE_GPU, &celsius), READ_TEMPERATURE))
        row[s->col_slow + 1] = celsius;
    if (readable(g, READ_MEMORY) && !failed(s, g, s->memory(g->device, &memory), READ_MEMORY))
        row[s->col_slow + 2] = (double)(memory.used >> 20);
}

static void sample_round(sampler_t *s, int slow) {
    for (int i = 0; i < s->n_gpus; i++) {
        gpu_t *g = &s->gpus[i];
        double *row = s->ring + (s->rows % s->capacity) * s->row_doubles;
        for (int64_t c = 0; c < s->row_doubles; c++)
            row[c] = NAN;
        /* Each GPU's own time, right before its counters: throughput comes from counter deltas. */
        row[0] = (double)((now_ns(CLOCK_MONOTONIC) + s->epoch_offset_ns) / 1000);
        row[1] = g->label;
        unsigned int sm = 0, mem = 0;
        unsigned long long reasons = 0;
        if (readable(g, READ_CLOCKS) && !failed(s, g, s->clock_info(g->device, NVML_CLOCK_SM, &sm), READ_CLOCKS) &&
            !failed(s, g, s->clock_info(g->device, NVML_CLOCK_MEM, &mem), READ_CLOCKS)) {
            row[s->col_clocks] = sm;
            row[s->col_clocks + 1] = mem;
        }
        if (readable(g, READ_REASONS) && !failed(s, g, s->reasons(g->device, &reasons), READ_REASONS))
            row[s->col_clocks + 2] = (double)reasons;
        if (s->n_fields > 0 && s->rounds % s->fields_every == 0 && readable(g, READ_FIELDS) &&
            !failed(s, g, s->field_values(g->device, s->n_fields, g->fields), READ_FIELDS)) {
            for (int f = 0; f < s->n_fields; f++)
                if (g->fields[f].nvmlReturn == NVML_SUCCESS)
                    row[s->col_fields + f] = field_as_double(&g->fields[f]);
        }
        if (slow)
            slow_reads(s, g, row);
        s->rows++;
    }
}

/* The schedule of recorder._run (nvml/recorder.py): absolute deadlines; from spin_below_ns on only sleeps, below
   it sleeps to an estimate of the oversleep before the deadline and spins the rest; an overrun
   skips the deadlines it can no longer meet and counts them as dropped. */
static void *run(void *arg) {
    sampler_t *s = arg;
    int64_t start = now_ns(CLOCK_MONOTONIC), deadline = start, next_slow = start, late_wake_ns = 60000;
    int64_t cpu0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
    while (!s->stop) {
        if (s->interval_ns >= s->spin_below_ns) {
            sleep_until(deadline);
        } else {
            int64_t lead = late_wake_ns < s->interval_ns ? late_wake_ns : s->interval_ns;
            if (deadline - now_ns(CLOCK_MONOTONIC) > lead) {
                int64_t asked = deadline - lead;
                sleep_until(asked);
                int64_t late = now_ns(CLOCK_MONOTONIC) - asked;
                late = late < 0 ? 0 : late > MAX_LATE_WAKE_NS ? MAX_LATE_WAKE_NS : late;
                late_wake_ns += (late - late_wake_ns) / 10;
            }
            while (now_ns(CLOCK_MONOTONIC) < deadline) {
            }
        }
        int slow = deadline >= next_slow;
        if (slow)
            next_slow = (next_slow + s->slow_period_ns > deadline) ? next_slow + s->slow_period_ns : deadline;
        sample_round(s, slow);
        s->rounds++;
        deadline += s->interval_ns;
        int64_t late = now_ns(CLOCK_MONOTONIC) - deadline;
        if (late >= s->interval_ns) {
            int64_t skipped = late / s->interval_ns;
            s->dropped += skipped;
            deadline += skipped * s->interval_ns;
        }
    }
    s->wall_s = (now_ns(CLOCK_MONOTONIC) - start) / 1e9;
    s->cpu_s = (now_ns(CLOCK_THREAD_CPUTIME_ID) - cpu0) / 1e9;
    return NULL;
}

int ss_sampler_size(void) { return (int)sizeof(sampler_t); }
int ss_start(sampler_t *s) { s->stop = 0; return pthread_create(&s->thread, NULL, run, s); }
int ss_stop(sampler_t *s) { s->stop = 1; return pthread_join(s->thread, NULL); }
