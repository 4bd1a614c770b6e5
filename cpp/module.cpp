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
    // An engine binds a tensor by its address on every first use of the tensor: numpy's __array_interface__
    // builds a dict for it (~1.2 us), the buffer protocol answers in ~0.1.
    m.def(
        "address_of",
        [](py::handle buffer) {
            Py_buffer view;
            if (PyObject_GetBuffer(buffer.ptr(), &view, PyBUF_SIMPLE) != 0) throw py::error_already_set();
            const auto address = reinterpret_cast<uintptr_t>(view.buf);
            PyBuffer_Release(&view);
            return address;
        },
        py::arg("buffer"), "The address of the first byte of a contiguous buffer (anything with the buffer protocol).");
    register_buffer(m);
    register_convert(m);
}
