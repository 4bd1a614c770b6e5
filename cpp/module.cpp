// npurt._native: buffers and kernels only. No engine logic lives here.
#include <pybind11/pybind11.h>
#include <unistd.h>

#include "errors.hpp"

namespace py = pybind11;

void register_buffer(py::module_ &m);   // buffer.cpp
void register_convert(py::module_ &m);  // convert.cpp

namespace {

// The one translation of npurt's C++ errors (errors.hpp) into Python exceptions, for every function here.
void translate_error(std::exception_ptr p) {
    try {
        if (p) std::rethrow_exception(p);
    } catch (const npurt::SysError &e) {
        // OSError(errno, message) picks the matching subclass (FileNotFoundError, PermissionError, ...).
        py::object err =
            py::reinterpret_steal<py::object>(PyObject_CallFunction(PyExc_OSError, "is", e.err, e.what()));
        if (err) PyErr_SetObject(reinterpret_cast<PyObject *>(Py_TYPE(err.ptr())), err.ptr());
    } catch (const npurt::ArgError &e) {
        PyErr_SetString(PyExc_ValueError, e.what());
    }
}

}  // namespace

PYBIND11_MODULE(_native, m) {
    m.doc() = "npurt native extension: zero-copy buffers, DMA-BUF, cache sync and conversion kernels";
    py::register_local_exception_translator(translate_error);
    m.def("page_size", []() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); },
          "The system page size in bytes.");
    register_buffer(m);
    register_convert(m);
}
