// A read-only, private memory mapping of a whole file. The GGUF reader keeps
// tensor data in place through it, so weights are paged in on demand instead
// of being copied at load time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/result.h"

namespace tern::gguf {

class MappedFile {
public:
    MappedFile() = default;
    ~MappedFile();
    MappedFile(MappedFile&& other) noexcept;
    MappedFile& operator=(MappedFile&& other) noexcept;
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    // Maps `path` with PROT_READ and MAP_PRIVATE. An empty file yields an
    // empty mapping (data() == nullptr, size() == 0), not an error.
    static Result<MappedFile> open(const std::string& path);

    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }

    // Lets go of this process's pages of the whole pages within [p, p + n)
    // that lie in the mapping (nothing else): the bytes stay in the page
    // cache, and a later read of them faults them back in unchanged. For a
    // reader done with bytes it has copied, so that the process does not
    // hold them twice.
    void release_pages(const void* p, size_t n) const;

private:
    void release();
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
};

}  // namespace tern::gguf
