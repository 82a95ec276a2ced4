// Owning handle for an hwloc bitmap (cpuset or nodeset).
#pragma once

#include <zenbind/hwloc.h>

#include <new>
#include <utility>

namespace zb {

class Bitmap {
  public:
    Bitmap() : b_(hwloc_bitmap_alloc()) {
        if (!b_) throw std::bad_alloc();
    }
    explicit Bitmap(hwloc_const_bitmap_t other) : b_(hwloc_bitmap_dup(other)) {
        if (!b_) throw std::bad_alloc();
    }
    Bitmap(const Bitmap &other) : Bitmap(other.get()) {}
    Bitmap(Bitmap &&other) noexcept : b_(std::exchange(other.b_, nullptr)) {}
    Bitmap &operator=(Bitmap other) noexcept {
        std::swap(b_, other.b_);
        return *this;
    }
    ~Bitmap() { hwloc_bitmap_free(b_); }

    hwloc_bitmap_t get() noexcept { return b_; }
    hwloc_const_bitmap_t get() const noexcept { return b_; }
    operator hwloc_bitmap_t() noexcept { return b_; }
    operator hwloc_const_bitmap_t() const noexcept { return b_; }

  private:
    hwloc_bitmap_t b_;
};

} // namespace zb
