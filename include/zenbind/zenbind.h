/* zenbind.h: the C ABI of libzenbind.
 *
 * Topology, cpusets, the allowed CPUs of a process, the options grammar and the planner that
 * splits a node's CPUs among local tasks and, inside each task, between the training process and
 * its optimizer worker. The worker API is in <zenbind/worker.h>.
 *
 * Conventions (see libzenbind(3)):
 *  - Every call that can fail returns a zb_status; ZB_OK is 0 and failures are negative. The
 *    message of the last failure in the calling thread is zb_last_error(). No call aborts the
 *    caller, throws, or blocks without a bound.
 *  - Cpusets and nodesets are zb_cpuset_t objects, indexed by OS (physical) number, as in
 *    /sys/devices/system/cpu. Objects returned by a zb_*_alloc/create/load/compute call are freed
 *    by the matching zb_*_free; pointers into an object live as long as the object. No hwloc type
 *    is part of this ABI; <zenbind/hwloc.h> converts for programs that use hwloc themselves.
 *
 * How the ABI grows (libzenbind.so.2):
 *  - Every exported symbol carries the version node of the release that added it (ZENBIND_2 for
 *    everything in libzenbind.so.2); a new release adds a node for its new symbols, and programs
 *    linked against an older library keep running.
 *  - A configuration a caller fills (zb_options, zb_worker_attr, zb_adam_args) starts with its
 *    size: its _init() call, an inline function here, passes sizeof as the caller was compiled,
 *    sets every field to its default and records that size. A later release appends fields and
 *    reads them only from a caller whose size holds them; the default keeps the old behaviour.
 *  - The calls that compute or spawn take a `flags` argument, 0 in this release (any other bit
 *    is refused with ZB_EINVAL): new behaviour comes as a flag, not as a new entry point.
 *  - zb_struct_size() lets a binding in another language check the layouts it mirrors (the
 *    Python package does, at import).
 *  - zb_api_version() is the ABI's version, ZB_API_VERSION (the SONAME's number); zb_version()
 *    is the package's.
 */
#ifndef ZENBIND_ZENBIND_H
#define ZENBIND_ZENBIND_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ZB_VERSION_MAJOR, _MINOR, _PATCH, ZB_VERSION_NUMBER and ZB_API_VERSION, from the build. */
#include <zenbind/version.h>

/* The environment the SPANK plugin exports into each task and the worker reads by default
 * (zenflow_bind(8), ENVIRONMENT). */
#define ZB_ENV_TRAIN_CPUS "ZENFLOW_TRAIN_CPUS"
#define ZB_ENV_TRAIN_THREADS "ZENFLOW_TRAIN_THREADS"
#define ZB_ENV_OPT_CPUS "ZENFLOW_OPT_CPUS"
#define ZB_ENV_OPT_THREADS "ZENFLOW_OPT_THREADS"
#define ZB_ENV_OPT_MEMS "ZENFLOW_OPT_MEMS"
#define ZB_ENV_TASK_CPUS "ZENFLOW_TASK_CPUS"
#define ZB_ENV_STEP_CPUS "ZENFLOW_STEP_CPUS"
#define ZB_ENV_BIND_OPTIONS "ZENFLOW_BIND_OPTIONS"
/* Where the worker executable is, when not given to zb_worker_spawn(). */
#define ZB_ENV_OPTIMIZER "ZENFLOW_OPTIMIZER"

/* ---- errors ----------------------------------------------------------------------------- */

typedef enum zb_status {
    ZB_OK = 0,
    ZB_EINVAL = -1,      /* bad argument or bad user input (the message names it) */
    ZB_ENOMEM = -2,      /* out of memory, or a memory/tmpfs limit refused a reservation */
    ZB_ESYS = -3,        /* a system call failed (the message carries strerror) */
    ZB_ETOPOLOGY = -4,   /* topology could not be loaded or does not match the input */
    ZB_EIMPOSSIBLE = -5, /* the options cannot be satisfied with the allowed CPUs */
    ZB_ETIMEDOUT = -6,   /* a bounded wait ran out */
    ZB_EDEAD = -7,       /* the peer process (worker or trainer) died */
    ZB_EVERSION = -8,    /* shared-memory layout or protocol version mismatch */
    ZB_EINTERNAL = -9,   /* a bug: please report the message */
    ZB_ENOENT = -10      /* not present, which is not a failure: e.g. no cpuset controller */
} zb_status;

/* Message describing the last failure in the calling thread ("" if none). Valid until the next
 * libzenbind call in this thread. */
const char *zb_last_error(void);
/* Stable short name of a status, e.g. "EINVAL". */
const char *zb_status_name(zb_status status);
/* The package's version as "MAJOR.MINOR.PATCH". */
const char *zb_version(void);
/* The ABI's version, ZB_API_VERSION as the library was built (the N of libzenbind.so.N): a
 * program compares it with the ZB_API_VERSION it was compiled against. */
unsigned zb_api_version(void);
/* sizeof of a public struct, by its name ("zb_worker_step", ...), as this library was built; 0
 * for a name it does not know. For bindings that mirror the layouts. */
size_t zb_struct_size(const char *name);

/* ---- cpusets ------------------------------------------------------------------------------ */

/* A set of CPU or NUMA node numbers (OS numbers), possibly infinite (hwloc's full set). */
typedef struct zb_cpuset zb_cpuset_t;

/* A new empty set; NULL when out of memory (zb_last_error() says so). */
zb_cpuset_t *zb_cpuset_alloc(void);
void zb_cpuset_free(zb_cpuset_t *set);
/* How many numbers `set` holds; -1 for an infinite set. */
int zb_cpuset_weight(const zb_cpuset_t *set);
/* 1 if `id` is in `set`, else 0. */
int zb_cpuset_isset(const zb_cpuset_t *set, unsigned id);
/* The smallest number in `set` above `prev` (-1: the first); -1 when there is none. */
int zb_cpuset_next(const zb_cpuset_t *set, int prev);
/* 1 if both sets hold the same numbers, else 0. */
int zb_cpuset_isequal(const zb_cpuset_t *a, const zb_cpuset_t *b);

/* ---- cpu lists ---------------------------------------------------------------------------- */

/* Largest CPU or NUMA node number accepted in a list (guards against "0-4000000000"). */
#define ZB_CPULIST_MAX_ID 65535

/* Parse a Linux cpu-list ("0,4-11,21-26", also "0-63:2" is NOT accepted) strictly into `out`
 * (cleared first). Accepts decimal ids and ascending ranges separated by commas, no spaces except
 * one trailing newline (as read from sysfs). "" is the empty set. */
zb_status zb_cpulist_parse(const char *list, zb_cpuset_t *out);
/* Print `set` as a canonical cpu-list into buf (always NUL-terminated when len > 0). Returns the
 * length the full list needs, excluding the NUL, like snprintf; -1 for an infinite set. */
int zb_cpulist_format(const zb_cpuset_t *set, char *buf, size_t len);

/* ---- topology ----------------------------------------------------------------------------- */

typedef struct zb_topology zb_topology_t;

/* The live machine, including CPUs this process may not use (the allowed set is separate). */
zb_status zb_topology_load(zb_topology_t **out);
/* An hwloc XML export (lstopo foo.xml). */
zb_status zb_topology_load_xml(const char *path, zb_topology_t **out);
/* An hwloc synthetic description, e.g. "pack:2 [numa] core:16 pu:2(indexes=core:pack)". */
zb_status zb_topology_load_synthetic(const char *description, zb_topology_t **out);
void zb_topology_free(zb_topology_t *topology);
/* All CPUs of the topology. (Its hwloc topology: zb_topology_hwloc(), <zenbind/hwloc.h>.) */
const zb_cpuset_t *zb_topology_cpuset(const zb_topology_t *topology);

/* ---- allowed CPUs ------------------------------------------------------------------------- */

/* The cpuset of the cgroup of process `pid` (0: the caller), found from <fsroot>/proc/PID/cgroup
 * and <fsroot>/proc/PID/mountinfo, for cgroup v1 (cpuset controller) and v2. `levels_up` reads
 * that many ancestors up (1: the parent, e.g. a Slurm step above its task_N cgroup). Reads the
 * effective set of the level that confines the process: v1, the nearest non-empty one; v2, the
 * nearest that configures cpuset.cpus, else the mount's root. `fsroot` NULL or "" means "/". The
 * file read is written to `source` (may be NULL). ZB_ENOENT when there is no cpuset controller;
 * ZB_ESYS when a file that should be there cannot be read. */
zb_status zb_cgroup_cpuset(const char *fsroot, pid_t pid, unsigned levels_up, zb_cpuset_t *out,
                           char *source, size_t source_len);

/* How many more bytes process `pid` (0: the caller) may use before its memory cgroup's limit (v1
 * memory.limit_in_bytes, v2 memory.max) at its own level or any above it: the least of limit
 * minus working set (usage less inactive file pages) over those levels. `limit` and `in_use`
 * (may be NULL) are those of the binding level, whose limit file goes to `source`. ZB_ENOENT when
 * no limit applies (no memory controller, or none set). */
zb_status zb_cgroup_memory_headroom(const char *fsroot, pid_t pid, uint64_t *headroom,
                                    uint64_t *limit, uint64_t *in_use, char *source,
                                    size_t source_len);

/* The CPUs process `pid` (0: the caller) may run on: its cgroup cpuset intersected with its
 * affinity. Without a cpuset controller, its affinity alone (`source` says "sched_getaffinity"). */
zb_status zb_allowed_cpus(const char *fsroot, pid_t pid, zb_cpuset_t *out, char *source,
                          size_t source_len);

/* ---- options ------------------------------------------------------------------------------ */

/* What SMT siblings of the optimizer's cores are used for. */
typedef enum zb_smt {
    ZB_SMT_IDLE = 0, /* optimizer: one hardware thread per core, siblings left idle (default) */
    ZB_SMT_TRAIN,    /* the siblings of optimizer cores run training threads */
    ZB_SMT_OPT       /* the optimizer runs one thread on every hardware thread of its cores */
} zb_smt;

/* How NUMA shapes a task's share. */
typedef enum zb_numa {
    ZB_NUMA_PREFER = 0, /* as few NUMA nodes per task as possible (default) */
    ZB_NUMA_STRICT,     /* every task inside one NUMA node, else the plan is impossible */
    ZB_NUMA_IGNORE      /* take cores in topology order, ignoring node boundaries */
} zb_numa;

/* Where a string of options comes from: admin keys are accepted only from plugstack.conf. */
typedef enum zb_scope { ZB_SCOPE_USER = 0, ZB_SCOPE_ADMIN = 1 } zb_scope;

/* What a task's share is for (mode=). */
typedef enum zb_mode {
    ZB_MODE_SPLIT = 0, /* training + an optimizer worker on CPUs of its own (default) */
    ZB_MODE_OFFLOAD    /* the whole share trains; the optimizer runs inside the training process */
} zb_mode;

/* Bits of zb_options.set: which keys a parse has set explicitly. */
enum {
    ZB_SET_ENABLED = 1u << 0,
    ZB_SET_TRAIN = 1u << 1,
    ZB_SET_OPT = 1u << 2,
    ZB_SET_SMT = 1u << 3,
    ZB_SET_NUMA = 1u << 4,
    ZB_SET_PROFILE = 1u << 5,
    ZB_SET_VERBOSE = 1u << 6,
    ZB_SET_BATCH = 1u << 7,
    ZB_SET_DEFAULT = 1u << 8,
    ZB_SET_OVERRIDE = 1u << 9,
    ZB_SET_ONERROR = 1u << 10,
    ZB_SET_MODE = 1u << 11,
    ZB_SET_GPU = 1u << 12,
    ZB_SET_GPUMAP = 1u << 13
};

/* Whether each task's share goes beside its GPU (gpu=). */
typedef enum zb_gpu_place {
    ZB_GPU_NEAR = 0, /* tasks of a step with GPUs go on their GPU's NUMA node (default) */
    ZB_GPU_IGNORE    /* shares in topology order, whatever the GPUs */
} zb_gpu_place;

/* The longest path an option takes (profile=, gpumap=), its NUL included. */
#define ZB_OPTION_PATH_MAX 4096

/* Options, filled by zb_options_init() then by one or more zb_options_parse() calls (later
 * strings override earlier ones, key by key). The grammar is comma-separated key[=value]:
 *   user and admin keys:
 *     on | off          binding on (the default when the option is given) or off
 *     train=N|F         training cores per task: N >= 1 cores, or a fraction 0 < F < 1 of the share
 *     opt=N             optimizer cores per task, N >= 1
 *     smt=idle|train|opt
 *     numa=prefer|strict|ignore
 *     profile=PATH      a tuning profile written by `zenbind tune` (absolute path)
 *     verbose           print each task's binding to stderr
 *     batch             bind the batch step (the sbatch script) too
 *     mode=split|offload  training + optimizer worker (split, default), or the whole share for a
 *                       training process that runs its optimizer itself (offload)
 *     gpu=near|ignore   place each task's share on its GPU's NUMA node (near, default) or not
 *   admin keys (ZB_SCOPE_ADMIN only):
 *     default=on|off    bind every step without the option (on) or only on request (off, default)
 *     override=allow|deny  may users change the admin's values (allow, default)
 *     onerror=fail|warn    an impossible plan fails the task, or warns and leaves it unbound (warn)
 *     gpumap=PATH       a GPU map file (zb_gpus_load) instead of discovering the node's GPUs
 */
typedef struct zb_options {
    size_t size;           /* sizeof(zb_options) as the caller was compiled: zb_options_init() */
    int enabled;           /* 1 on, 0 off */
    unsigned train_cores;  /* 0: not given */
    double train_fraction; /* 0: not given; otherwise 0 < F < 1 */
    unsigned opt_cores;    /* 0: not given */
    zb_smt smt;
    zb_numa numa;
    int verbose;
    int batch;
    char profile[ZB_OPTION_PATH_MAX]; /* "" when not given */
    int default_on;                   /* admin */
    int allow_override;               /* admin */
    int fail_on_error;                /* admin */
    unsigned set;                     /* ZB_SET_* bits set by parses */
    zb_mode mode;
    zb_gpu_place gpu;
    char gpumap[ZB_OPTION_PATH_MAX]; /* admin; "" when not given */
} zb_options;

/* Every field to its default (binding off, nothing set), `size` to `size`. */
void zb_options_init_size(zb_options *options, size_t size);
static inline void zb_options_init(zb_options *options) {
    zb_options_init_size(options, sizeof *options);
}
/* Apply the keys of `text` (NULL or "" applies nothing) onto `options`. On error `options` is
 * unchanged and zb_last_error() names the offending key and the accepted values. */
zb_status zb_options_parse(zb_options *options, const char *text, zb_scope scope);
/* Canonical text of `options` (every key that differs from zb_options_init), like snprintf. */
int zb_options_format(const zb_options *options, char *buf, size_t len);
/* The keys `scope` accepts with their values ("on|off, train=N|F, opt=N, ..."), like snprintf. */
int zb_options_usage(zb_scope scope, char *buf, size_t len);
/* The admin override check (override=deny): the first user key that the user set (bits of
 * `user_set`) and the admin set too, whose value in `merged` differs from the admin's; NULL if
 * none. Every user key is checked; admin-only keys never are. */
const char *zb_options_overridden(const zb_options *admin, const zb_options *merged,
                                  unsigned user_set);

/* ---- planner ------------------------------------------------------------------------------ */

typedef struct zb_plan zb_plan_t;

/* One task's share. Pointers are owned by the plan. */
typedef struct zb_task_plan {
    const zb_cpuset_t *cpus;       /* everything the task got (train_cpus | opt_cpus) */
    const zb_cpuset_t *train_cpus; /* affinity of the training process */
    const zb_cpuset_t *opt_cpus;   /* one entry per optimizer thread */
    const zb_cpuset_t *nodes;      /* NUMA nodes (OS numbers) the task's CPUs are in */
    const zb_cpuset_t *opt_mems;   /* NUMA nodes for optimizer memory */
    unsigned train_threads;        /* OMP_NUM_THREADS for training */
    unsigned opt_threads;          /* optimizer worker threads */
    unsigned cores;                /* whole cores in the share */
} zb_task_plan;

/* Plan `ntasks` local tasks on `allowed` CPUs of `topology` (a pure function: same inputs, same
 * plan). ZB_EINVAL if allowed is empty, has CPUs outside the topology, ntasks is 0 or flags is
 * not 0; ZB_EIMPOSSIBLE if the options cannot be met (e.g. numa=strict across nodes). Degenerate
 * but workable cases (a single core per task, more tasks than cores) succeed with warnings.
 *
 * `gpu_nodes` (may be NULL: no task has a GPU) is the NUMA node (OS number) of each task's GPU:
 * gpu_nodes[i] for local task i, -1 for a task without one. The shares are the same with or
 * without it; which task gets which changes. In task order, each task whose GPU's node holds
 * cores of a free share takes the one with most cores there; then each other task with a GPU
 * takes the free share nearest its node (hwloc distances, else the topology tree); tasks without
 * a GPU take the shares left, in order. A task not placed on its GPU's node, or whose node is not
 * in the topology, is named in a warning. options->gpu == ZB_GPU_IGNORE ignores gpu_nodes. */
zb_status zb_plan_compute(const zb_topology_t *topology, const zb_cpuset_t *allowed,
                          unsigned ntasks, const zb_options *options, const int *gpu_nodes,
                          unsigned long flags, zb_plan_t **out);
void zb_plan_free(zb_plan_t *plan);
unsigned zb_plan_ntasks(const zb_plan_t *plan);
/* Task `index`'s share; ZB_EINVAL if index >= ntasks. */
zb_status zb_plan_task(const zb_plan_t *plan, unsigned index, zb_task_plan *out);
unsigned zb_plan_nwarnings(const zb_plan_t *plan);
/* Warning `index` (NULL if out of range), a full sentence naming the task(s) concerned. */
const char *zb_plan_warning(const zb_plan_t *plan, unsigned index);
/* The GPU node task `index` was planned with (-1: none, or out of range). */
int zb_plan_task_gpu_node(const zb_plan_t *plan, unsigned index);

/* ---- GPUs --------------------------------------------------------------------------------- */

/* Largest GPU index accepted (in a map file, an environment list, a --gpus list). */
#define ZB_GPU_MAX_INDEX 1023

typedef struct zb_gpus zb_gpus_t;

/* One GPU of the node. Pointers are owned by the zb_gpus_t. */
typedef struct zb_gpu {
    unsigned index;                /* the GPU's index on the node, as Slurm numbers it */
    int numa_node;                 /* OS number of its NUMA node; -1 when unknown */
    const char *bus_id;            /* PCI address "0000:07:00.0"; "" when a map gives none */
    const zb_cpuset_t *local_cpus; /* CPUs the kernel calls local to it; empty if unknown */
} zb_gpu;

/* The node's GPUs. With `map` (not NULL or ""), exactly those a GPU map file lists (format in
 * zenflow_bind(8), GPU MAP: "INDEX NODE [BUS-ID]" lines). Otherwise discovered under `fsroot`
 * (NULL or "" means "/"): the GPUs of the NVIDIA driver's proc/driver/nvidia/gpus/BUS/information
 * (those it does not exclude), else the NVIDIA and AMD display-class functions of
 * sys/bus/pci/devices; index = position in PCI address order (nvidia-smi's, NVML's, CUDA's and
 * Slurm's AutoDetect order), never the device minor. Each GPU's node and local CPUs are its PCI
 * function's numa_node and local_cpulist. ZB_ENOENT when there are none, or when the driver has
 * MIG instances (Slurm numbers their slices); ZB_EINVAL for a bad map file (the message names the
 * file and line). */
zb_status zb_gpus_load(const char *fsroot, const char *map, zb_gpus_t **out);
void zb_gpus_free(zb_gpus_t *gpus);
unsigned zb_gpus_count(const zb_gpus_t *gpus);
/* The `i`-th GPU, in index order; ZB_EINVAL if i >= count. */
zb_status zb_gpus_get(const zb_gpus_t *gpus, unsigned i, zb_gpu *out);
/* The GPU with index `index`; ZB_ENOENT if there is none. */
zb_status zb_gpus_find(const zb_gpus_t *gpus, unsigned index, zb_gpu *out);
/* Where the GPUs came from: the map file, or the directory discovery read. */
const char *zb_gpus_source(const zb_gpus_t *gpus);
/* Which GPU each of `ntasks` local tasks drives, from the step's GPU list as Slurm exports it
 * (SLURM_STEP_GPUS: indexes separated by commas). With n GPUs for T tasks, task i drives the
 * (i * (n / T))-th when n >= T (Slurm's --gpus-per-task binding, and one GPU per local rank when
 * n == T), else the (i * n / T)-th (consecutive tasks share a GPU). task_gpu[i] is its index.
 * ZB_EINVAL for a list that is not decimal indexes 0..ZB_GPU_MAX_INDEX separated by commas. */
zb_status zb_gpus_assign(const char *step_gpus, unsigned ntasks, unsigned *task_gpu);

/* ---- tuning profiles ---------------------------------------------------------------------- */

typedef struct zb_profile zb_profile_t;

/* A profile written by `zenbind tune`: per NUMA node (OS number), the Adam throughput measured on
 * 1..n optimizer cores and the smallest count within 5% of the best (where memory bandwidth
 * saturates). Text format in zenbind(1), section PROFILE FORMAT. */
zb_status zb_profile_load(const char *path, zb_profile_t **out);
void zb_profile_free(zb_profile_t *profile);
/* Build a profile (what `zenbind tune` does): add each node's throughput on 1..ncounts cores
 * (gb_per_s[i] for i+1 cores); its saturation is the smallest count within 5% of the best. Save
 * writes a new file atomically (a temporary file renamed over `path`). */
zb_status zb_profile_create(zb_profile_t **out);
zb_status zb_profile_add_node(zb_profile_t *profile, unsigned node, const double *gb_per_s,
                              unsigned ncounts);
zb_status zb_profile_save(const zb_profile_t *profile, const char *path);
/* Optimizer cores that saturate node `node` (0: the profile does not know that node). */
unsigned zb_profile_saturation(const zb_profile_t *profile, unsigned node);
/* Set options->opt_cores from the profile unless the options already fix the split (train= or
 * opt= given): the tasks sharing a NUMA node share its saturating core count, so each gets
 * ceil(saturation / tasks on that node), at least 1, the largest over the nodes the tasks use.
 * Leaves options unchanged when the profile knows none of those nodes. */
zb_status zb_profile_apply(const zb_profile_t *profile, const zb_topology_t *topology,
                           const zb_cpuset_t *allowed, unsigned ntasks, zb_options *options);

#ifdef __cplusplus
}
#endif

#endif /* ZENBIND_ZENBIND_H */
