/*
 * libnvml.c - a simulated NVML (libnvidia-ml.so.1) for GPU-less test hosts.
 *
 * Unmodified NVML clients (nvidia-ml-py's `import pynvml`) load this library
 * through LD_LIBRARY_PATH and see the GPUs described by a state directory
 * (env SIMGPU_STATE_DIR, default /var/lib/simgpu).  The directory format is
 * documented in README.md; in short:
 *
 *   config          key=value lines: devices, versions, failure switches
 *   allocs/<file>   one key=value file per (process, GPU) allocation,
 *                   written by the Python side (simgpu.alloc) atomically
 *
 * Nothing is cached between queries: the config's dynamic settings and
 * allocs/ are re-read on every call, because tests flip settings and kill
 * processes between two polls of a long-running client and expect the
 * next poll to see it, exactly as with a real driver.
 *
 * Only the public C ABI is reproduced (x86-64 layouts, return codes and
 * version constants as published in nvml.h).  No NVIDIA code is used.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Public ABI (subset of nvml.h)                                              */
/* ------------------------------------------------------------------------ */

typedef enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

/* Opaque to clients; here it is one slot of g_devices (see valid_device). */
typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

/* nvml.h: NVML_STRUCT_VERSION(Memory, 2) = sizeof(nvmlMemory_v2_t) | 2 << 24 */
#define NVML_MEMORY_V2_VERSION ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2U << 24)))

/* Taken by the unversioned legacy symbol only. */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

/* Taken by the _v2 and _v3 symbols (nvml.h names it nvmlProcessInfo_t too). */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t;

_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t layout");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t layout");
_Static_assert(NVML_MEMORY_V2_VERSION == 0x02000028, "nvmlMemory_v2 version");
_Static_assert(sizeof(nvmlProcessInfo_v1_t) == 16, "nvmlProcessInfo_v1_t layout");
_Static_assert(sizeof(nvmlProcessInfo_v2_t) == 24, "nvmlProcessInfo_t layout");

/* Everything is hidden (-fvisibility=hidden) except what is marked API. */
#define API __attribute__((visibility("default")))

/* ------------------------------------------------------------------------ */
/* Simulation state                                                           */
/* ------------------------------------------------------------------------ */

#define SIM_MAX_GPUS 64
#define SIM_STR 96 /* NVML_DEVICE_NAME_V2_BUFFER_SIZE / _UUID_V2_ */
#define SIM_VER 80 /* NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE / _NVML_ */
#define SIM_DEFAULT_STATE_DIR "/var/lib/simgpu"
#define MIB (1024ULL * 1024ULL)
/* MIG is never enabled: nvml.h asks for 0xFFFFFFFF in the instance ids. */
#define NO_MIG_INSTANCE 0xFFFFFFFFU

struct nvmlDevice_st {
    unsigned int index;
};

struct sim_config {
    unsigned int gpu_count;
    char name[SIM_STR];
    char uuid[SIM_MAX_GPUS][SIM_STR];
    char driver_version[SIM_VER];
    char nvml_version[SIM_VER];
    int cuda_driver_version;
    unsigned long long total_mib;
    unsigned long long reserved_mib;
    long long release_delay_ms;
    int leak;
    int fail_driver;                  /* fail=driver_not_loaded */
    unsigned char lost[SIM_MAX_GPUS]; /* lost_gpus */
};

/*
 * One mutex serialises every entry point: NVML is documented as thread-safe,
 * and the simulation mutates shared state (refcount, cached config) and the
 * state directory from any thread.  Queries are cheap file reads, so the
 * contention this causes is irrelevant for a test double.
 */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned int g_refcount;
static char g_state_dir[PATH_MAX];
static struct sim_config g_cfg;
/*
 * Handles are pointers into this static array, so they stay valid across
 * nvmlShutdown/nvmlInit and config reloads, and can be validated by address
 * without ever dereferencing a caller's garbage pointer.
 */
static struct nvmlDevice_st g_devices[SIM_MAX_GPUS];

static void debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Opt-in diagnostics on stderr: a library must stay silent by default. */
static void debug(const char *fmt, ...)
{
    if (!getenv("SIMGPU_DEBUG"))
        return;
    va_list ap;
    va_start(ap, fmt);
    fputs("simgpu: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static long long now_ms(void)
{
    /* Realtime, not monotonic: dead_at_ms is written by other processes. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ------------------------------------------------------------------------ */
/* key=value parsing (shared by config and allocation files)                 */
/* ------------------------------------------------------------------------ */

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    char *end = s + strlen(s);
    while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r' || end[-1] == '\n'))
        *--end = '\0';
    return s;
}

/*
 * Calls fn(ctx, key, value) for each "key=value" line of path; blank lines
 * and '#' comments are skipped.  Returns -1 (errno set) if path cannot be
 * opened, else 0.
 */
static int parse_kv_file(const char *path, void (*fn)(void *ctx, const char *key, char *value),
                         void *ctx)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    char line[1024];
    while (fgets(line, sizeof(line), f)) {
        char *s = trim(line);
        if (*s == '\0' || *s == '#')
            continue;
        char *eq = strchr(s, '=');
        if (!eq)
            continue;
        *eq = '\0';
        fn(ctx, trim(s), trim(eq + 1));
    }
    fclose(f);
    return 0;
}

/* Strict unsigned parse: the whole string must be a number. */
static int parse_ull(const char *s, unsigned long long *out)
{
    if (*s < '0' || *s > '9')
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end != '\0')
        return -1;
    *out = v;
    return 0;
}

static void copy_str(char *dst, size_t size, const char *src)
{
    snprintf(dst, size, "%s", src);
}

/* ------------------------------------------------------------------------ */
/* config                                                                     */
/* ------------------------------------------------------------------------ */

static void config_kv(void *ctx, const char *key, char *value)
{
    struct sim_config *c = ctx;
    unsigned long long n;

    if (!strcmp(key, "gpu_count")) {
        if (parse_ull(value, &n) == 0)
            c->gpu_count = n > SIM_MAX_GPUS ? SIM_MAX_GPUS + 1 : (unsigned int)n;
    } else if (!strcmp(key, "name")) {
        copy_str(c->name, sizeof(c->name), value);
    } else if (!strncmp(key, "uuid.", 5)) {
        if (parse_ull(key + 5, &n) == 0 && n < SIM_MAX_GPUS)
            copy_str(c->uuid[n], sizeof(c->uuid[n]), value);
    } else if (!strcmp(key, "driver_version")) {
        copy_str(c->driver_version, sizeof(c->driver_version), value);
    } else if (!strcmp(key, "nvml_version")) {
        copy_str(c->nvml_version, sizeof(c->nvml_version), value);
    } else if (!strcmp(key, "cuda_driver_version")) {
        if (parse_ull(value, &n) == 0 && n <= INT_MAX)
            c->cuda_driver_version = (int)n;
    } else if (!strcmp(key, "total_mib")) {
        if (parse_ull(value, &n) == 0)
            c->total_mib = n;
    } else if (!strcmp(key, "reserved_mib")) {
        if (parse_ull(value, &n) == 0)
            c->reserved_mib = n;
    } else if (!strcmp(key, "release_delay_ms")) {
        if (parse_ull(value, &n) == 0 && n <= LLONG_MAX / 2)
            c->release_delay_ms = (long long)n;
    } else if (!strcmp(key, "leak")) {
        c->leak = !strcmp(value, "1") || !strcmp(value, "true");
    } else if (!strcmp(key, "fail")) {
        c->fail_driver = !strcmp(value, "driver_not_loaded");
    } else if (!strcmp(key, "lost_gpus")) {
        memset(c->lost, 0, sizeof(c->lost));
        for (char *save = NULL, *tok = strtok_r(value, ", ", &save); tok;
             tok = strtok_r(NULL, ", ", &save))
            if (parse_ull(tok, &n) == 0 && n < SIM_MAX_GPUS)
                c->lost[n] = 1;
    }
    /* Unknown keys are ignored so newer Python tooling can add keys. */
}

static void config_path(char *buf, size_t size)
{
    snprintf(buf, size, "%s/config", g_state_dir);
}

/*
 * Parses <state dir>/config into *out.  NVML_ERROR_DRIVER_NOT_LOADED when the
 * file is missing (no "driver" on this host); NVML_ERROR_UNKNOWN when it is
 * unusable (a broken test fixture should be loud, not look like a GPU).
 */
static nvmlReturn_t config_load(struct sim_config *out)
{
    char path[PATH_MAX + 16];
    config_path(path, sizeof(path));
    memset(out, 0, sizeof(*out));
    out->gpu_count = SIM_MAX_GPUS + 2; /* sentinel: key missing */
    if (parse_kv_file(path, config_kv, out) != 0) {
        debug("cannot read %s: %s", path, strerror(errno));
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    if (out->gpu_count > SIM_MAX_GPUS) {
        debug("%s: gpu_count missing or above %d", path, SIM_MAX_GPUS);
        return NVML_ERROR_UNKNOWN;
    }
    for (unsigned int i = 0; i < out->gpu_count; i++) {
        if (out->uuid[i][0] == '\0') {
            debug("%s: uuid.%u missing", path, i);
            return NVML_ERROR_UNKNOWN;
        }
    }
    return NVML_SUCCESS;
}

/*
 * Called (locked) at the start of every query after init.  Refreshes the
 * settings that tests flip while a client keeps the library initialised:
 * failure switches, memory sizes, release delay, leak.  The device set
 * (count, names, UUIDs) and versions stay as seen at nvmlInit, as with a
 * real driver, so handles never change meaning under a client.
 *
 * The file is simply re-parsed: it is a few hundred bytes, every query
 * already reads allocs/, and a stat()-based cache could miss two quick
 * rewrites (coarse mtimes, recycled inode numbers).
 */
static void config_refresh(void)
{
    struct sim_config fresh;
    if (config_load(&fresh) != NVML_SUCCESS)
        return; /* gone or broken mid-run: keep the last known state */
    g_cfg.total_mib = fresh.total_mib;
    g_cfg.reserved_mib = fresh.reserved_mib;
    g_cfg.release_delay_ms = fresh.release_delay_ms;
    g_cfg.leak = fresh.leak;
    g_cfg.fail_driver = fresh.fail_driver;
    memcpy(g_cfg.lost, fresh.lost, sizeof(g_cfg.lost));
}

/* ------------------------------------------------------------------------ */
/* Allocations                                                                */
/* ------------------------------------------------------------------------ */

struct sim_alloc {
    unsigned long long pid, gpu, mib, starttime;
    long long dead_at_ms; /* -1: death not recorded yet */
    unsigned int seen;    /* bit per mandatory key, to reject partial files */
};

static void alloc_kv(void *ctx, const char *key, char *value)
{
    struct sim_alloc *a = ctx;
    unsigned long long n;
    if (parse_ull(value, &n) != 0)
        return;
    if (!strcmp(key, "pid")) {
        a->pid = n;
        a->seen |= 1;
    } else if (!strcmp(key, "gpu")) {
        a->gpu = n;
        a->seen |= 2;
    } else if (!strcmp(key, "mib")) {
        a->mib = n;
        a->seen |= 4;
    } else if (!strcmp(key, "starttime")) {
        a->starttime = n;
        a->seen |= 8;
    } else if (!strcmp(key, "dead_at_ms") && n <= LLONG_MAX / 2) {
        a->dead_at_ms = (long long)n;
    }
}

static int alloc_read(const char *path, struct sim_alloc *a)
{
    memset(a, 0, sizeof(*a));
    a->dead_at_ms = -1;
    if (parse_kv_file(path, alloc_kv, a) != 0)
        return -1;
    return a->seen == 15 && a->pid > 0 && a->pid <= INT_MAX ? 0 : -1;
}

/*
 * Is the process that made the allocation still running?  The start time
 * (field 22 of /proc/<pid>/stat, clock ticks since boot) guards against a
 * recycled pid; a zombie has already released its CUDA context.
 */
static int process_alive(unsigned long long pid, unsigned long long starttime)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%llu/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';

    /* comm (field 2) may contain spaces and ')': skip to the last ')'. */
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ')
        return 0;
    p += 2;
    char state = *p;
    if (state == 'Z' || state == 'X' || state == 'x')
        return 0;
    /* p is at field 3; field 22 is 19 separators further. */
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p)
            return 0;
        p++;
    }
    return strtoull(p, NULL, 10) == starttime;
}

/*
 * Records the first time any client saw this allocation's process dead,
 * for processes that had no watcher (or whose watcher was killed).  The
 * file is re-read just before the rename so that a dead_at_ms written by
 * the watcher (more precise) in the meantime wins; the remaining window is
 * a few microseconds and only costs precision, never correctness.
 */
static void alloc_record_death(const char *dir, const char *name, const struct sim_alloc *a,
                               long long when)
{
    char path[PATH_MAX + 512], tmp[PATH_MAX + 512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    snprintf(tmp, sizeof(tmp), "%s/.%s.%ld.%lx.tmp", dir, name, (long)getpid(),
             (unsigned long)pthread_self());
    FILE *f = fopen(tmp, "we");
    if (!f)
        return; /* read-only state dir: fall back to "dead since now" */
    fprintf(f, "pid=%llu\ngpu=%llu\nmib=%llu\nstarttime=%llu\ndead_at_ms=%lld\n", a->pid, a->gpu,
            a->mib, a->starttime, when);
    int bad = ferror(f);
    bad |= fclose(f);

    struct sim_alloc again;
    if (bad || alloc_read(path, &again) != 0 || again.dead_at_ms >= 0 || rename(tmp, path) != 0)
        unlink(tmp);
}

struct proc_usage {
    unsigned int pid;
    unsigned long long mib;
};

struct gpu_usage {
    unsigned long long used_mib; /* live + not yet released + leaked */
    struct proc_usage *procs;    /* live processes, one entry per pid */
    unsigned int nprocs, cap;
};

static void usage_free(struct gpu_usage *u)
{
    free(u->procs);
    memset(u, 0, sizeof(*u));
}

static int usage_add_proc(struct gpu_usage *u, unsigned int pid, unsigned long long mib)
{
    for (unsigned int i = 0; i < u->nprocs; i++) {
        if (u->procs[i].pid == pid) {
            u->procs[i].mib += mib;
            return 0;
        }
    }
    if (u->nprocs == u->cap) {
        unsigned int cap = u->cap ? u->cap * 2 : 8;
        struct proc_usage *p = realloc(u->procs, cap * sizeof(*p));
        if (!p)
            return -1;
        u->procs = p;
        u->cap = cap;
    }
    u->procs[u->nprocs].pid = pid;
    u->procs[u->nprocs].mib = mib;
    u->nprocs++;
    return 0;
}

/*
 * Scans allocs/ for one GPU, applying the lifecycle of a CUDA context:
 *   live process          -> listed, memory used
 *   dead, within delay    -> not listed, memory still used (driver teardown)
 *   dead, delay elapsed   -> freed (file removed), unless leak=1 (stuck)
 * Returns NVML_SUCCESS, or NVML_ERROR_UNKNOWN on allocation failure.
 */
static nvmlReturn_t usage_scan(unsigned int gpu, struct gpu_usage *u)
{
    char dir[PATH_MAX + 16];
    memset(u, 0, sizeof(*u));
    snprintf(dir, sizeof(dir), "%s/allocs", g_state_dir);
    DIR *d = opendir(dir);
    if (!d)
        return NVML_SUCCESS; /* no allocation ever made */

    long long now = now_ms();
    nvmlReturn_t ret = NVML_SUCCESS;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') /* ".", "..", in-flight temporaries */
            continue;
        char path[PATH_MAX + 512];
        struct sim_alloc a;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (alloc_read(path, &a) != 0 || a.gpu != gpu)
            continue;

        if (process_alive(a.pid, a.starttime)) {
            u->used_mib += a.mib;
            if (usage_add_proc(u, (unsigned int)a.pid, a.mib) != 0) {
                ret = NVML_ERROR_UNKNOWN;
                break;
            }
            continue;
        }
        if (a.dead_at_ms < 0) {
            alloc_record_death(dir, e->d_name, &a, now);
            a.dead_at_ms = now;
        }
        if (g_cfg.leak || now < a.dead_at_ms + g_cfg.release_delay_ms)
            u->used_mib += a.mib;
        else
            unlink(path); /* released; ENOENT from a concurrent reader is fine */
    }
    closedir(d);
    if (ret != NVML_SUCCESS)
        usage_free(u);
    return ret;
}

/* ------------------------------------------------------------------------ */
/* Entry-point helpers                                                        */
/* ------------------------------------------------------------------------ */

/* Locks and checks the library is usable; on failure the lock is released. */
static nvmlReturn_t enter(void)
{
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    config_refresh();
    if (g_cfg.fail_driver) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    return NVML_SUCCESS;
}

static nvmlReturn_t leave(nvmlReturn_t ret)
{
    pthread_mutex_unlock(&g_lock);
    return ret;
}

static int valid_device(nvmlDevice_t dev)
{
    uintptr_t p = (uintptr_t)dev, base = (uintptr_t)g_devices;
    if (p < base || (p - base) % sizeof(g_devices[0]) != 0)
        return 0;
    return (p - base) / sizeof(g_devices[0]) < g_cfg.gpu_count;
}

/* enter() plus handle validation and the lost_gpus switch. */
static nvmlReturn_t enter_device(nvmlDevice_t dev)
{
    nvmlReturn_t ret = enter();
    if (ret != NVML_SUCCESS)
        return ret;
    if (!valid_device(dev))
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (g_cfg.lost[dev->index])
        return leave(NVML_ERROR_GPU_IS_LOST);
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_out(char *buf, unsigned int length, const char *value)
{
    if (!buf)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Init / shutdown / errors                                                   */
/* ------------------------------------------------------------------------ */

API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags; /* NO_GPUS / NO_ATTACH change nothing in the simulation */
    pthread_mutex_lock(&g_lock);

    /* Every init re-reads the environment and config, even a nested one,
     * so a test can rebuild the host between two init/shutdown pairs. */
    const char *dir = getenv("SIMGPU_STATE_DIR");
    if (!dir || !*dir)
        dir = SIM_DEFAULT_STATE_DIR;
    if (strlen(dir) >= sizeof(g_state_dir)) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    char saved_dir[PATH_MAX];
    copy_str(saved_dir, sizeof(saved_dir), g_state_dir);
    copy_str(g_state_dir, sizeof(g_state_dir), dir);

    struct sim_config cfg;
    nvmlReturn_t ret = config_load(&cfg);
    if (ret == NVML_SUCCESS && cfg.fail_driver)
        ret = NVML_ERROR_DRIVER_NOT_LOADED;
    if (ret != NVML_SUCCESS) {
        /* A failed nested init must not disturb the clients already in. */
        copy_str(g_state_dir, sizeof(g_state_dir), saved_dir);
        pthread_mutex_unlock(&g_lock);
        return ret;
    }
    g_cfg = cfg;
    for (unsigned int i = 0; i < SIM_MAX_GPUS; i++)
        g_devices[i].index = i;
    g_refcount++;
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlInit_v2(void)
{
    return nvmlInitWithFlags(0);
}

API nvmlReturn_t nvmlInit(void)
{
    return nvmlInitWithFlags(0);
}

API nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t ret = NVML_SUCCESS;
    if (g_refcount == 0)
        ret = NVML_ERROR_UNINITIALIZED;
    else
        g_refcount--;
    pthread_mutex_unlock(&g_lock);
    return ret;
}

API const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

/* ------------------------------------------------------------------------ */
/* System queries                                                             */
/* ------------------------------------------------------------------------ */

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    nvmlReturn_t ret = enter();
    if (ret != NVML_SUCCESS)
        return ret;
    return leave(copy_out(version, length, g_cfg.driver_version));
}

API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    nvmlReturn_t ret = enter();
    if (ret != NVML_SUCCESS)
        return ret;
    return leave(copy_out(version, length, g_cfg.nvml_version));
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    nvmlReturn_t ret = enter();
    if (ret != NVML_SUCCESS)
        return ret;
    if (!cudaDriverVersion)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *cudaDriverVersion = g_cfg.cuda_driver_version;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/*
 * The first element of /proc/<pid>/cmdline, as a real driver reports it
 * (which is why setproctitle'd SGLang ranks show up as "sglang::...").
 * An empty cmdline means a zombie or kernel thread: not a GPU process.
 */
API nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length)
{
    nvmlReturn_t ret = enter();
    if (ret != NVML_SUCCESS)
        return ret;
    if (!name || pid == 0)
        return leave(NVML_ERROR_INVALID_ARGUMENT);

    char path[64], buf[4096];
    snprintf(path, sizeof(path), "/proc/%u/cmdline", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return leave(NVML_ERROR_NOT_FOUND);
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return leave(NVML_ERROR_NOT_FOUND);
    buf[n] = '\0'; /* the first NUL ends argv[0] */
    return leave(copy_out(name, length, buf));
}

/* ------------------------------------------------------------------------ */
/* Device enumeration                                                         */
/* ------------------------------------------------------------------------ */

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    nvmlReturn_t ret = enter();
    if (ret != NVML_SUCCESS)
        return ret;
    if (!deviceCount)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *deviceCount = g_cfg.gpu_count; /* lost GPUs are still enumerated */
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return nvmlDeviceGetCount_v2(deviceCount);
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    nvmlReturn_t ret = enter();
    if (ret != NVML_SUCCESS)
        return ret;
    if (!device || index >= g_cfg.gpu_count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *device = &g_devices[index];
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    nvmlReturn_t ret = enter();
    if (ret != NVML_SUCCESS)
        return ret;
    if (!uuid || !device)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned int i = 0; i < g_cfg.gpu_count; i++) {
        if (!strcmp(uuid, g_cfg.uuid[i])) {
            *device = &g_devices[i];
            return leave(NVML_SUCCESS);
        }
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

/* ------------------------------------------------------------------------ */
/* Device queries                                                             */
/* ------------------------------------------------------------------------ */

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    nvmlReturn_t ret = enter_device(device);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!index)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *index = device->index;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    nvmlReturn_t ret = enter_device(device);
    if (ret != NVML_SUCCESS)
        return ret;
    return leave(copy_out(name, length, g_cfg.name));
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    nvmlReturn_t ret = enter_device(device);
    if (ret != NVML_SUCCESS)
        return ret;
    return leave(copy_out(uuid, length, g_cfg.uuid[device->index]));
}

/* Memory figures in MiB for one device; called locked. */
static nvmlReturn_t memory_mib(nvmlDevice_t device, unsigned long long *procs_mib)
{
    struct gpu_usage u;
    nvmlReturn_t ret = usage_scan(device->index, &u);
    *procs_mib = u.used_mib;
    usage_free(&u);
    return ret;
}

static unsigned long long sub_floor0(unsigned long long a, unsigned long long b)
{
    return a > b ? a - b : 0; /* an overcommitted fixture must not wrap */
}

/* v1: used = reserved + process memory, as old drivers report it. */
API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    nvmlReturn_t ret = enter_device(device);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!memory)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long procs;
    ret = memory_mib(device, &procs);
    if (ret != NVML_SUCCESS)
        return leave(ret);
    memory->total = g_cfg.total_mib * MIB;
    memory->used = (g_cfg.reserved_mib + procs) * MIB;
    memory->free = sub_floor0(memory->total, memory->used);
    return leave(NVML_SUCCESS);
}

/* v2: reserved reported apart; used is process memory only (near 0 idle). */
API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    nvmlReturn_t ret = enter_device(device);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!memory)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (memory->version != NVML_MEMORY_V2_VERSION)
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    unsigned long long procs;
    ret = memory_mib(device, &procs);
    if (ret != NVML_SUCCESS)
        return leave(ret);
    memory->total = g_cfg.total_mib * MIB;
    memory->reserved = g_cfg.reserved_mib * MIB;
    memory->used = procs * MIB;
    memory->free = sub_floor0(memory->total, memory->reserved + memory->used);
    return leave(NVML_SUCCESS);
}

/*
 * Shared body of the process-list calls.  Size protocol (nvml.h): *count is
 * the capacity on input and the number of entries on output; when infos is
 * NULL or too small, *count gets the number needed and INSUFFICIENT_SIZE is
 * returned, except that an empty list is always a SUCCESS.
 */
static nvmlReturn_t list_processes(nvmlDevice_t device, unsigned int *count, void *infos,
                                   int v1_layout, int compute)
{
    nvmlReturn_t ret = enter_device(device);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);

    struct gpu_usage u = {0};
    if (compute) { /* no graphics or MPS clients are ever simulated */
        ret = usage_scan(device->index, &u);
        if (ret != NVML_SUCCESS)
            return leave(ret);
    }
    if (u.nprocs == 0) {
        *count = 0;
    } else if (!infos || *count < u.nprocs) {
        *count = u.nprocs;
        ret = NVML_ERROR_INSUFFICIENT_SIZE;
    } else {
        for (unsigned int i = 0; i < u.nprocs; i++) {
            if (v1_layout) {
                nvmlProcessInfo_v1_t *p = (nvmlProcessInfo_v1_t *)infos + i;
                p->pid = u.procs[i].pid;
                p->usedGpuMemory = u.procs[i].mib * MIB;
            } else {
                nvmlProcessInfo_v2_t *p = (nvmlProcessInfo_v2_t *)infos + i;
                p->pid = u.procs[i].pid;
                p->usedGpuMemory = u.procs[i].mib * MIB;
                p->gpuInstanceId = NO_MIG_INSTANCE;
                p->computeInstanceId = NO_MIG_INSTANCE;
            }
        }
        *count = u.nprocs;
    }
    usage_free(&u);
    return leave(ret);
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_v1_t *infos)
{
    return list_processes(device, infoCount, infos, 1, 1);
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                         unsigned int *infoCount,
                                                         nvmlProcessInfo_v2_t *infos)
{
    return list_processes(device, infoCount, infos, 0, 1);
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                         unsigned int *infoCount,
                                                         nvmlProcessInfo_v2_t *infos)
{
    return list_processes(device, infoCount, infos, 0, 1);
}

API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                       nvmlProcessInfo_v1_t *infos)
{
    return list_processes(device, infoCount, infos, 1, 0);
}

API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device,
                                                          unsigned int *infoCount,
                                                          nvmlProcessInfo_v2_t *infos)
{
    return list_processes(device, infoCount, infos, 0, 0);
}

API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device,
                                                          unsigned int *infoCount,
                                                          nvmlProcessInfo_v2_t *infos)
{
    return list_processes(device, infoCount, infos, 0, 0);
}

API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t device,
                                                         unsigned int *infoCount,
                                                         nvmlProcessInfo_v1_t *infos)
{
    return list_processes(device, infoCount, infos, 1, 0);
}

API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t device,
                                                            unsigned int *infoCount,
                                                            nvmlProcessInfo_v2_t *infos)
{
    return list_processes(device, infoCount, infos, 0, 0);
}

API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device,
                                                            unsigned int *infoCount,
                                                            nvmlProcessInfo_v2_t *infos)
{
    return list_processes(device, infoCount, infos, 0, 0);
}
