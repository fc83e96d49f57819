// POSIX implementation of MappedFile.
#include "gguf/mmap.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdint>
#include <utility>

namespace tern::gguf {

MappedFile::~MappedFile() { release(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
    if (this != &other) {
        release();
        data_ = std::exchange(other.data_, nullptr);
        size_ = std::exchange(other.size_, 0);
    }
    return *this;
}

void MappedFile::release() {
    if (data_) munmap(const_cast<uint8_t*>(data_), size_);
    data_ = nullptr;
    size_ = 0;
}

void MappedFile::release_pages(const void* p, size_t n) const {
    if (!data_ || !p || n == 0) return;
    const auto page = uintptr_t(sysconf(_SC_PAGESIZE));
    const auto at = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(data_);
    const uintptr_t lo = std::max(at, base);
    const uintptr_t hi = std::min(at + std::min<uintptr_t>(n, UINTPTR_MAX - at), base + size_);
    const uintptr_t first = (lo + page - 1) / page * page, last = hi / page * page;
    // A private mapping never written holds the file's pages only, so dropping
    // them loses nothing; advice, so a failure changes nothing either.
    if (first < last) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

Result<MappedFile> MappedFile::open(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Error{path + ": cannot open: " + std::strerror(errno)};
    struct stat st {};
    if (fstat(fd, &st) != 0) {
        int err = errno;
        ::close(fd);
        return Error{path + ": cannot stat: " + std::strerror(err)};
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        return Error{path + ": not a regular file"};
    }
    MappedFile m;
    if (st.st_size > 0) {
        void* p = mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int err = errno;
            ::close(fd);
            return Error{path + ": cannot map " + std::to_string(st.st_size) +
                         " bytes: " + std::strerror(err)};
        }
        m.data_ = static_cast<const uint8_t*>(p);
        m.size_ = size_t(st.st_size);
    }
    ::close(fd);  // the mapping keeps the file alive
    return m;
}

}  // namespace tern::gguf
