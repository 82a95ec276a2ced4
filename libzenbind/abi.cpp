// zb_struct_size: the public layouts as this library was built, for bindings that mirror them.
#include <zenbind/adam.h>
#include <zenbind/worker.h>
#include <zenbind/zenbind.h>

#include <cstring>

extern "C" size_t zb_struct_size(const char *name) {
    if (!name) return 0;
    struct Entry {
        const char *name;
        size_t size;
    };
    static const Entry entries[] = {
        {"zb_options", sizeof(zb_options)},
        {"zb_task_plan", sizeof(zb_task_plan)},
        {"zb_gpu", sizeof(zb_gpu)},
        {"zb_worker_attr", sizeof(zb_worker_attr)},
        {"zb_adam_hyper", sizeof(zb_adam_hyper)},
        {"zb_group_attr", sizeof(zb_group_attr)},
        {"zb_group_buffers", sizeof(zb_group_buffers)},
        {"zb_worker_step", sizeof(zb_worker_step)},
        {"zb_worker_result", sizeof(zb_worker_result)},
        {"zb_worker_memory", sizeof(zb_worker_memory)},
        {"zb_step_range", sizeof(zb_step_range)},
        {"zb_adam_tensor", sizeof(zb_adam_tensor)},
        {"zb_adam_args", sizeof(zb_adam_args)},
        {"zb_grad_stats", sizeof(zb_grad_stats)},
    };
    for (const Entry &e : entries)
        if (std::strcmp(e.name, name) == 0) return e.size;
    return 0;
}
