// The errors of npurt._native: plain C++ exceptions, translated to Python exceptions at the boundary by the
// one translator that module.cpp registers.
//
// They hold no Python objects, so code may throw them anywhere, also while the GIL is released: the
// py::gil_scoped_release in scope takes the GIL back while the exception unwinds, before pybind11 runs the
// translator.
#pragma once

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace npurt {

// A failed system call: becomes OSError(errno, message), so Python sees the matching subclass
// (FileNotFoundError, PermissionError, ...).
struct SysError : std::runtime_error {
    int err;
    // "<what>: <strerror(e)>"
    SysError(int e, const std::string &what) : std::runtime_error(what + ": " + std::strerror(e)), err(e) {}
    // The message as given (it already says what went wrong).
    struct Verbatim {};
    SysError(int e, const std::string &message, Verbatim) : std::runtime_error(message), err(e) {}
};

// A bad argument: becomes ValueError(message).
struct ArgError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

[[noreturn]] inline void fail_errno(const std::string &what) { throw SysError(errno, what); }

}  // namespace npurt
