// Error values for the edges of the library: parsers and loaders return a
// Result<T> whose error names what was wrong (field, offset, file), so callers
// decide how to report it. Nothing here throws.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace tern {

struct Error {
    std::string message;
};

template <class T>
class [[nodiscard]] Result {
public:
    Result(T value) : v_(std::move(value)) {}
    Result(Error error) : v_(std::move(error)) {}

    bool ok() const { return v_.index() == 0; }
    explicit operator bool() const { return ok(); }

    T& value() & { return std::get<0>(v_); }
    const T& value() const& { return std::get<0>(v_); }
    T&& value() && { return std::get<0>(std::move(v_)); }
    T* operator->() { return &value(); }
    const T* operator->() const { return &value(); }
    T& operator*() & { return value(); }
    const T& operator*() const& { return value(); }

    const Error& error() const { return std::get<1>(v_); }

private:
    std::variant<T, Error> v_;
};

// Result<void>: success or an error.
struct Status {
    Status() = default;
    Status(Error e) : error_(std::move(e.message)), failed_(true) {}
    static Status ok_status() { return {}; }
    bool ok() const { return !failed_; }
    explicit operator bool() const { return ok(); }
    const std::string& message() const { return error_; }

private:
    std::string error_;
    bool failed_ = false;
};

}  // namespace tern
