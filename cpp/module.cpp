// npurt._native: buffers and kernels only. No engine logic lives here.
#include <pybind11/pybind11.h>
#include <unistd.h>

namespace py = pybind11;

void register_buffer(py::module_ &m);   // buffer.cpp
void register_convert(py::module_ &m);  // convert.cpp

PYBIND11_MODULE(_native, m) {
    m.doc() = "npurt native extension: zero-copy buffers, DMA-BUF, cache sync and conversion kernels";
    m.def("page_size", []() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); },
          "The system page size in bytes.");
    register_buffer(m);
    register_convert(m);
}
