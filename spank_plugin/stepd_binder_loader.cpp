#include "stepd_binder_loader.hpp"

#include <dlfcn.h>

namespace zb::spank {
namespace {

constexpr const char *kBinderFile = "zenflow_bind_binder.so";

std::string own_directory() {
    Dl_info info{};
    if (!dladdr(reinterpret_cast<void *>(&load_binder), &info) || !info.dli_fname) return "";
    const std::string self = info.dli_fname;
    const size_t slash = self.rfind('/');
    return slash == std::string::npos ? "" : self.substr(0, slash);
}

} // namespace

const zb_binder *load_binder(std::string &error) {
    static const zb_binder *loaded = nullptr;
    if (loaded) return loaded;
    std::string tried;
    for (const std::string &dir : {own_directory(), std::string(ZB_BINDER_DIR)}) {
        if (dir.empty()) continue;
        const std::string path = dir + "/" + kBinderFile;
        void *handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!handle) {
            const char *why = dlerror();
            tried += (tried.empty() ? "" : "; ") + std::string(why ? why : path);
            continue;
        }
        using Get = const zb_binder *(*)();
        const auto get = reinterpret_cast<Get>(dlsym(handle, "zb_binder_get"));
        const zb_binder *binder = get ? get() : nullptr;
        if (!binder || binder->abi != ZB_BINDER_ABI) {
            tried +=
                (tried.empty() ? "" : "; ") + path + " is not a binder of this plugin's version";
            dlclose(handle);
            continue;
        }
        loaded = binder; // kept loaded for the life of the process
        return loaded;
    }
    error = "cannot load " + std::string(kBinderFile) + " (" + tried + ")";
    return nullptr;
}

} // namespace zb::spank
