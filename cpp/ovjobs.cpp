// npurt._ovjobs: OpenVINO infer requests whose completion is recorded in C++, for jobs started on the engine.
//
// Why: a job started on a Python InferRequest is waited for one request at a time (the Python API has no wait for
// whichever of several requests ends, and a Python completion callback takes the GIL on OpenVINO's thread per run,
// ~17 us on the 2-core VM). Here each request's completion callback is C++: it records the end (order, error) and
// wakes the waiters, with no GIL; a wait for one run or for whichever of several ends waits on a condition variable
// with the GIL released, and has a timeout.
//
// Objects cross from openvino._pyopenvino by pybind11's conduit (_pybind11_conduit_v1_): a raw pointer, checked by
// platform ABI id and C++ type name, valid while the Python object lives. Nothing else of OpenVINO's bindings is
// used, so a different pybind11 version or internals in OpenVINO's wheel does not matter; OpenVINO's C++ ABI does
// (this module links the libopenvino it was built against: another OpenVINO fails its import, and npurt keeps its
// Python path).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/conduit/pybind11_conduit_v1.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <openvino/runtime/compiled_model.hpp>
#include <openvino/runtime/infer_request.hpp>
#include <openvino/runtime/tensor.hpp>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

template <class T>
T &from_openvino(py::handle obj, const char *what) {
    T *p = pybind11_conduit_v1::get_type_pointer_ephemeral<T>(obj.ptr());
    if (p == nullptr) {
        if (PyErr_Occurred()) throw py::error_already_set();
        throw py::type_error(std::string("not an ") + what +
                             " of the OpenVINO this module was built with (pybind11 conduit refused it)");
    }
    return *p;
}

enum State : uint8_t { IDLE, RUNNING, ENDED, FINISHING };

// N infer requests of one compiled model. Slots are picked, pointed at tensors and started under the GIL; runs
// end on OpenVINO's threads (the C++ callback); waits release the GIL. A run is named by a ticket (its slot and the
// slot's count of starts), so that a call about a run that another call has already finished (and whose slot may
// run something else by now) is told so, never answered about the slot's next run.
//
// The mutex is never held by a thread that waits for the GIL (waits take it with the GIL released and let it go
// before taking the GIL back; the callback never takes the GIL), so it may be taken with the GIL held.
class Requests {
public:
    // ports: per tensor position, (is_output, index among the compiled model's inputs or outputs); shape_positions:
    // the positions (of `ports`) whose shapes `finish` reports, for outputs whose shape the run decides.
    Requests(py::handle compiled, size_t n, const std::vector<std::pair<bool, size_t>> &ports,
             const std::vector<size_t> &shape_positions)
        : shape_positions_(shape_positions) {
        if (n == 0) throw py::value_error("Requests: n >= 1");
        ov::CompiledModel &model = from_openvino<ov::CompiledModel>(compiled, "openvino.CompiledModel");
        for (const auto &[is_output, index] : ports)
            ports_.push_back(is_output ? model.output(index) : model.input(index));
        for (size_t k : shape_positions_)
            if (k >= ports_.size()) throw py::index_error("shape_positions: no such port position");
        {
            py::gil_scoped_release nogil;
            for (size_t i = 0; i < n; ++i) requests_.push_back(model.create_infer_request());
        }
        state_.assign(n, IDLE);
        starts_.assign(n, 0);
        order_.assign(n, 0);
        errors_.assign(n, std::string());
        held_.assign(n, std::vector<py::object>(ports_.size()));
        for (size_t i = 0; i < n; ++i)
            requests_[i].set_callback([this, i](std::exception_ptr error) { on_end(i, error); });
    }

    ~Requests() {
        // No run may outlive the callbacks' `this`: wait for each (the callback needs no GIL), then detach them.
        for (auto &r : requests_) {
            try {
                r.wait();
            } catch (...) {  // the run's error: not ours to report any more
            }
            r.set_callback([](std::exception_ptr) {});
        }
    }

    size_t size() const { return requests_.size(); }

    // Start one run on an idle slot pointed at `tensors` (ov.Tensor objects, in the order of `ports`; a slot that
    // holds the same object for a port keeps it): the run's ticket, or -1 where every slot is taken.
    int64_t start(const py::list &tensors) {
        if (tensors.size() != ports_.size()) throw py::value_error("start: one tensor per port");
        int64_t slot = -1;
        uint64_t count = 0;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            for (size_t i = 0; i < state_.size(); ++i)
                if (state_[i] == IDLE) {
                    slot = static_cast<int64_t>(i);
                    state_[i] = RUNNING;  // taken: no other start picks it
                    count = ++starts_[i];
                    break;
                }
        }
        if (slot < 0) return -1;
        ov::InferRequest &request = requests_[slot];
        try {
            // The run before may still be returning from its callback (OpenVINO marks the request done after it):
            // a set_tensor or start on it now would find it busy. Its error was recorded by the callback.
            try {
                request.wait();
            } catch (...) {
            }
            auto &held = held_[slot];
            for (size_t k = 0; k < ports_.size(); ++k) {
                py::handle t = tensors[k];
                if (!held[k].is(t)) {
                    request.set_tensor(ports_[k], from_openvino<ov::Tensor>(t, "openvino.Tensor"));
                    held[k] = py::reinterpret_borrow<py::object>(t);  // a reference: the id stays this object's
                }
            }
            py::gil_scoped_release nogil;
            request.start_async();
        } catch (...) {
            std::lock_guard<std::mutex> lock(mutex_);
            state_[slot] = IDLE;
            throw;
        }
        return static_cast<int64_t>(count * requests_.size()) + slot;
    }

    // Wait up to timeout_ms (0: poll) for the ticket's run to end; whether it has.
    bool wait(int64_t ticket, int64_t timeout_ms) {
        const auto [slot, count] = decode(ticket);
        py::gil_scoped_release nogil;
        std::unique_lock<std::mutex> lock(mutex_);
        if (!running(slot, count)) return true;
        if (timeout_ms <= 0) return false;
        return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return !running(slot, count); });
    }

    // Wait up to timeout_ms for any of `tickets` to end: of those that have, the one that ended first (a run already
    // finished counts as the first); -1 if none.
    int64_t wait_any(const std::vector<int64_t> &tickets, int64_t timeout_ms) {
        std::vector<std::pair<size_t, uint64_t>> runs;
        for (int64_t t : tickets) runs.push_back(decode(t));
        py::gil_scoped_release nogil;
        std::unique_lock<std::mutex> lock(mutex_);
        int64_t first = -1;
        auto ended = [&] {
            uint64_t best = UINT64_MAX;
            for (size_t i = 0; i < runs.size(); ++i) {
                const auto [slot, count] = runs[i];
                if (running(slot, count)) continue;
                uint64_t order = starts_[slot] == count && state_[slot] == ENDED ? order_[slot] : 0;
                if (order < best) {
                    best = order;
                    first = tickets[i];
                }
            }
            return first >= 0;
        };
        if (ended() || timeout_ms <= 0) return first;
        cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), ended);
        return first;
    }

    // Wait up to timeout_ms (0: poll) for the ticket's run to end and finish it: the slot is idle again. None while
    // it runs; False where another call finished it; else its error message ("" if it succeeded), with the shapes at
    // shape_positions as (message, shapes) where the constructor named any.
    py::object finish(int64_t ticket, int64_t timeout_ms) {
        const auto [slot, count] = decode(ticket);
        std::unique_lock<std::mutex> lock(mutex_);  // (with the GIL held: see the class's comment)
        if (running(slot, count)) {
            if (timeout_ms <= 0) return py::none();
            lock.unlock();
            bool ended;
            {
                py::gil_scoped_release nogil;
                std::unique_lock<std::mutex> waiting(mutex_);
                ended = cv_.wait_for(waiting, std::chrono::milliseconds(timeout_ms),
                                     [&] { return !running(slot, count); });
            }
            if (!ended) return py::none();
            lock.lock();
        }
        if (starts_[slot] != count || state_[slot] != ENDED) return py::bool_(false);
        std::string error;
        error.swap(errors_[slot]);
        if (shape_positions_.empty()) {
            state_[slot] = IDLE;
            return message(error);
        }
        state_[slot] = FINISHING;  // no start takes it until its shapes are read
        lock.unlock();
        py::list shapes;
        try {
            ov::InferRequest &request = requests_[slot];
            try {
                request.wait();  // (past its callback: OpenVINO answers get_tensor on a request marked done)
            } catch (...) {
            }
            for (size_t k : shape_positions_) {
                const std::vector<size_t> dims = request.get_tensor(ports_[k]).get_shape();
                shapes.append(py::cast(dims));
            }
        } catch (const std::exception &e) {  // a failed run may leave no shape to read
            if (error.empty()) error = e.what();
        }
        lock.lock();
        state_[slot] = IDLE;
        lock.unlock();
        return py::make_tuple(message(error), shapes);
    }

private:
    std::pair<size_t, uint64_t> decode(int64_t ticket) const {
        if (ticket < 0) throw py::index_error("no such run");
        const uint64_t n = requests_.size(), t = static_cast<uint64_t>(ticket);
        return {static_cast<size_t>(t % n), t / n};
    }

    // An engine's message as str (bytes that are not UTF-8 replaced, never an exception of their own)
    static py::str message(const std::string &text) {
        PyObject *s = PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "replace");
        if (s == nullptr) throw py::error_already_set();
        return py::reinterpret_steal<py::str>(s);
    }

    // (under mutex_) whether the ticket's run is still running
    bool running(size_t slot, uint64_t count) const { return starts_[slot] == count && state_[slot] == RUNNING; }

    void on_end(size_t slot, std::exception_ptr error) {
        std::string message;
        if (error) {
            try {
                std::rethrow_exception(error);
            } catch (const std::exception &e) {
                message = e.what();
                if (message.empty()) message = "the inference failed";
            } catch (...) {
                message = "the inference failed (unknown error)";
            }
        }
        {
            std::lock_guard<std::mutex> lock(mutex_);
            errors_[slot] = std::move(message);
            order_[slot] = ++ended_;
            state_[slot] = ENDED;
        }
        cv_.notify_all();
    }

    std::vector<ov::Output<const ov::Node>> ports_;
    std::vector<size_t> shape_positions_;
    std::vector<ov::InferRequest> requests_;
    std::vector<std::vector<py::object>> held_;  // per slot, the ov.Tensor object each port points at
    std::mutex mutex_;
    std::condition_variable cv_;
    std::vector<State> state_;
    std::vector<uint64_t> starts_;  // per slot, runs started on it (a ticket's count)
    std::vector<uint64_t> order_;  // order of ending
    std::vector<std::string> errors_;
    uint64_t ended_ = 0;
};

}  // namespace

PYBIND11_MODULE(_ovjobs, m) {
    m.doc() = "npurt: OpenVINO infer requests with their completion recorded in C++ (jobs started on the engine)";
    py::class_<Requests>(m, "Requests")
        .def(py::init<py::handle, size_t, const std::vector<std::pair<bool, size_t>> &, const std::vector<size_t> &>(),
             py::arg("compiled_model"), py::arg("n"), py::arg("ports"), py::arg("shape_positions"))
        .def("__len__", &Requests::size)
        .def("start", &Requests::start, py::arg("tensors"))
        .def("wait", &Requests::wait, py::arg("ticket"), py::arg("timeout_ms"))
        .def("wait_any", &Requests::wait_any, py::arg("tickets"), py::arg("timeout_ms"))
        .def("finish", &Requests::finish, py::arg("ticket"), py::arg("timeout_ms"));
}
