// npurt._ovjobs: OpenVINO infer requests whose completion is recorded in C++, for jobs started on the engine.
//
// Why: a job started on a Python InferRequest is waited for one request at a time (the Python API has no wait for
// whichever of several requests ends, and a Python completion callback takes the GIL on OpenVINO's thread per run,
// ~17 us on the 2-core VM). Here each request's completion callback is C++: it records the end (order, error) and
// wakes the waiters, with no GIL; a wait for one run or for whichever of several ends waits on a condition variable
// with the GIL released, and has a timeout.
//
// A job lane: runs named by npurt's job ids (`reserve` + `launch`, `collect`, `collect_any`), whose table is kept
// here: the runner submits a job and collects it with a call or two, with no Python object made per job. A lane job that ended with
// nobody collecting it yet frees its request for the next submission (its outcome moves to a table of ended jobs),
// and the lane counts its jobs' ends as they happen (`counts`). A job the runner's scheduler must hold as its own
// (a close, a wait over jobs of several kinds) is `take`n: it stays collectable by id, but no longer counts here.
//
// Objects cross from openvino._pyopenvino by pybind11's conduit (_pybind11_conduit_v1_): a raw pointer, checked by
// platform ABI id and C++ type name, valid while the Python object lives. Nothing else of OpenVINO's bindings is
// used, so a different pybind11 version or internals in OpenVINO's wheel does not matter; OpenVINO's C++ ABI does
// (this module links the libopenvino it was built against: another OpenVINO fails its import, and npurt keeps its
// Python path).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/conduit/pybind11_conduit_v1.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <openvino/runtime/compiled_model.hpp>
#include <openvino/runtime/infer_request.hpp>
#include <openvino/runtime/tensor.hpp>
#include <string>
#include <unordered_map>
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
        kept_.assign(n, py::none());
        job_.assign(n, -1);
        taken_.assign(n, false);
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
            std::lock_guard<std::mutex> lock(mutex_);  // (with the GIL held: `held_` is compared under both)
            slot = take_slot_locked(-1, &tensors);
            if (slot >= 0) count = starts_[slot];
        }
        if (slot < 0) return -1;
        kept_[static_cast<size_t>(slot)] = py::none();  // (a ticket's caller holds what its run uses)
        run_on(static_cast<size_t>(slot), tensors);
        return static_cast<int64_t>(count * requests_.size()) + slot;
    }

    // -- the job lane (see the file's comment) --------------------------------------------------------------
    // Reserve a request for job `job_id` on `tensors` (what `launch` will be given), where the lane's running jobs
    // and `others` (the runner's other runs) are fewer than `limit`: 1 reserved (`launch` starts it), 0 every request
    // runs, -1 the limit is reached. The request already pointed at these tensors is taken where it is idle (see
    // take_slot_locked). Only for models whose outputs' shapes are fixed (no shape_positions).
    int reserve(int64_t job_id, size_t others, size_t limit, const py::list &tensors) {
        if (!shape_positions_.empty()) throw py::value_error("reserve: a lane runs only models with fixed output shapes");
        std::lock_guard<std::mutex> lock(mutex_);  // (with the GIL held: `held_` is compared under both)
        size_t running = 0;
        for (size_t i = 0; i < job_.size(); ++i) running += job_[i] >= 0 && !taken_[i] && state_[i] == RUNNING;
        if (others + running >= limit) return -1;
        if (take_slot_locked(job_id, &tensors) < 0) return 0;
        ++submitted_;
        return 1;
    }

    // Start reserved job `job_id` on `tensors` (ov.Tensor, ports' order); a failure to start is the job's outcome
    // (collected as its message), as a run's error is. `keep`: held until the job is collected (the memory the
    // tensors point at, where they do not hold it themselves), or the request runs again.
    void launch(int64_t job_id, const py::list &tensors, py::object keep) {
        int64_t slot;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            slot = slot_of_locked(job_id);
        }
        if (slot < 0) throw py::index_error("launch: no such reserved job");
        kept_[static_cast<size_t>(slot)] = std::move(keep);  // (the GIL held: the one it replaces goes here)
        try {
            if (tensors.size() != ports_.size()) throw py::value_error("launch: one tensor per port");
            run_on(static_cast<size_t>(slot), tensors);
        } catch (const std::exception &e) {
            std::string error = e.what();
            if (error.empty()) error = "the inference could not start";
            on_end(static_cast<size_t>(slot), std::make_exception_ptr(std::runtime_error(error)));
        } catch (...) {
            on_end(static_cast<size_t>(slot), std::make_exception_ptr(std::runtime_error("the inference could not start")));
        }
    }

    // Wait up to timeout_ms (0: poll) for lane job `job_id` and collect it: None while it runs, False for a job this
    // lane does not hold (never submitted here, collected already, or taken: `taken` says which kind is asked for),
    // else its error message ("" if it succeeded). A taken job's outcome stays until `forget`: its scheduler ends
    // its job from it first, so that an interruption between the two (Ctrl-C as this returns) loses nothing.
    py::object collect(int64_t job_id, int64_t timeout_ms, bool taken) {
        std::unique_lock<std::mutex> lock(mutex_);  // (with the GIL held: see the class's comment)
        if (lane_running_locked(job_id) && timeout_ms > 0) {
            lock.unlock();
            {
                py::gil_scoped_release nogil;
                std::unique_lock<std::mutex> waiting(mutex_);
                cv_.wait_for(waiting, clamped(timeout_ms), [&] { return !lane_running_locked(job_id); });
            }
            lock.lock();
        }
        std::string error;
        const State found = collect_locked(job_id, taken, error);
        lock.unlock();  // (Python objects made without the mutex: making one may run Python code)
        let_go_of_released();
        switch (found) {
            case RUNNING: return py::none();
            case IDLE: return py::bool_(false);
            default: return message(error);
        }
    }

    // Wait up to timeout_ms for whichever of lane jobs `job_ids` ends first and collect it (as `collect` does):
    // (job id, its message); None if none has; (job id, False) for the first id this lane does not hold (nothing
    // collected then).
    py::object collect_any(const std::vector<int64_t> &job_ids, int64_t timeout_ms, bool taken) {
        std::unique_lock<std::mutex> lock(mutex_);
        for (int64_t id : job_ids)
            if (!holds_locked(id, taken)) {
                lock.unlock();
                return py::make_tuple(id, false);
            }
        int64_t first = first_ended_locked(job_ids);
        if (first < 0 && timeout_ms > 0) {
            lock.unlock();
            {
                py::gil_scoped_release nogil;
                std::unique_lock<std::mutex> waiting(mutex_);
                cv_.wait_for(waiting, clamped(timeout_ms), [&] { return first_ended_locked(job_ids) >= 0; });
            }
            lock.lock();
            first = first_ended_locked(job_ids);
        }
        std::string error;
        const State found = first < 0 ? RUNNING : collect_locked(first, taken, error);
        lock.unlock();
        let_go_of_released();
        if (first < 0) return py::none();
        if (found != ENDED) return py::make_tuple(first, false);  // (taken meanwhile by another thread)
        return py::make_tuple(first, message(error));
    }

    // Forget a taken job's outcome (its scheduler has ended its job from it); nothing for a job not held.
    void forget(int64_t job_id) {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            auto it = lane_ended_.find(job_id);
            if (it != lane_ended_.end()) {
                if (it->second.taken) lane_ended_.erase(it);
                return;
            }
            const int64_t slot = slot_of_locked(job_id);
            if (slot >= 0 && taken_[slot] && state_[slot] == ENDED) free_slot_locked(static_cast<size_t>(slot));
        }
        let_go_of_released();
    }

    // Hand lane job `job_id` to the runner's scheduler: None if this lane does not hold it; else whether it has
    // ended (its end counted here). From now on its end is the scheduler's to count; it is still collected here.
    py::object take(int64_t job_id) {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = lane_ended_.find(job_id);
        if (it != lane_ended_.end()) {
            bool counted = !it->second.taken;
            it->second.taken = true;
            return py::bool_(counted);
        }
        int64_t slot = slot_of_locked(job_id);
        if (slot < 0) return py::none();
        bool counted = state_[slot] == ENDED && !taken_[slot];
        taken_[slot] = true;
        return py::bool_(counted);
    }

    // The lane's jobs not yet collected nor taken
    std::vector<int64_t> jobs() {
        std::lock_guard<std::mutex> lock(mutex_);
        std::vector<int64_t> ids;
        for (size_t i = 0; i < job_.size(); ++i)
            if (job_[i] >= 0 && !taken_[i]) ids.push_back(job_[i]);
        for (const auto &[id, e] : lane_ended_)
            if (!e.taken) ids.push_back(id);
        return ids;
    }

    // Lane jobs running (not taken): what the lane holds of the runner's concurrent runs
    size_t running_count() {
        std::lock_guard<std::mutex> lock(mutex_);
        size_t n = 0;
        for (size_t i = 0; i < job_.size(); ++i) n += job_[i] >= 0 && !taken_[i] && state_[i] == RUNNING;
        return n;
    }

    // Lane jobs not yet collected nor taken
    size_t uncollected() {
        std::lock_guard<std::mutex> lock(mutex_);
        size_t n = 0;
        for (size_t i = 0; i < job_.size(); ++i) n += job_[i] >= 0 && !taken_[i];
        for (const auto &entry : lane_ended_) n += !entry.second.taken;
        return n;
    }

    // (jobs submitted, ended, failed) on the lane, ends counted as they happen (taken jobs' ends excluded)
    py::tuple counts() {
        uint64_t submitted, completed, failed;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            submitted = submitted_, completed = completed_, failed = failed_;
        }
        return py::make_tuple(submitted, completed, failed);
    }

private:
    // (under mutex_, with the GIL) an idle slot, marked running for a lane job (job_id >= 0) or a ticket run (-1):
    // the one pointed at `tensors` where there is one (OpenVINO's CPU plugin spends ~10 us a port on the next run of
    // a request pointed at other tensors), else one pointed at tensors nothing else holds any more (their binding is
    // gone: re-pointing it lets their memory go), else one never pointed at any, else the first; where none is idle,
    // one whose lane job ended uncollected (its outcome kept in ended_); -1 if every slot runs
    int64_t take_slot_locked(int64_t job_id, const py::list *tensors) {
        int64_t slot = -1;
        if (tensors != nullptr && tensors->size() == ports_.size())
            for (size_t i = 0; i < state_.size() && slot < 0; ++i)
                if (state_[i] == IDLE && points_at(i, *tensors)) slot = static_cast<int64_t>(i);
        if (!ports_.empty()) {
            for (size_t i = 0; i < state_.size() && slot < 0; ++i)
                if (state_[i] == IDLE && held_[i][0] && Py_REFCNT(held_[i][0].ptr()) == 1) slot = static_cast<int64_t>(i);
            for (size_t i = 0; i < state_.size() && slot < 0; ++i)
                if (state_[i] == IDLE && !held_[i][0]) slot = static_cast<int64_t>(i);
        }
        for (size_t i = 0; i < state_.size() && slot < 0; ++i)
            if (state_[i] == IDLE) slot = static_cast<int64_t>(i);
        for (size_t i = 0; i < state_.size() && slot < 0; ++i)
            if (state_[i] == ENDED && job_[i] >= 0) {
                lane_ended_[job_[i]] = Ended{order_[i], std::move(errors_[i]), taken_[i]};
                errors_[i].clear();
                slot = static_cast<int64_t>(i);
            }
        if (slot >= 0) {
            state_[slot] = RUNNING;  // taken: no other start picks it
            ++starts_[slot];
            job_[slot] = job_id;
            taken_[slot] = false;
        }
        return slot;
    }

    // (with the GIL) whether slot i's request is pointed at exactly these tensors
    bool points_at(size_t i, const py::list &tensors) const {
        const auto &held = held_[i];
        for (size_t k = 0; k < held.size(); ++k)
            if (!held[k].is(tensors[k])) return false;
        return true;
    }

    // Point a slot taken for a run at `tensors` and start it (the GIL released while it starts); on failure the
    // slot is idle again and the error raised
    void run_on(size_t slot, const py::list &tensors) {
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
            if (job_[slot] < 0) {  // a ticket run: the slot is idle again and the caller told (a lane job: launch)
                std::lock_guard<std::mutex> lock(mutex_);
                state_[slot] = IDLE;
            }
            throw;
        }
    }

public:

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

    // (under mutex_) the slot that runs or ran lane job `job_id` (-1: none)
    int64_t slot_of_locked(int64_t job_id) const {
        if (job_id < 0) return -1;
        for (size_t i = 0; i < job_.size(); ++i)
            if (job_[i] == job_id) return static_cast<int64_t>(i);
        return -1;
    }

    // (under mutex_) whether lane job `job_id` is still running
    bool lane_running_locked(int64_t job_id) const {
        const int64_t slot = slot_of_locked(job_id);
        return slot >= 0 && state_[slot] == RUNNING;
    }

    // (under mutex_) whether the lane holds job `job_id`, taken or not as `taken` says
    bool holds_locked(int64_t job_id, bool taken) const {
        auto it = lane_ended_.find(job_id);
        if (it != lane_ended_.end()) return it->second.taken == taken;
        const int64_t slot = slot_of_locked(job_id);
        return slot >= 0 && taken_[slot] == taken;
    }

    // (under mutex_) collect lane job `job_id` (taken or not as `taken` says): RUNNING (not yet ended), IDLE (not a
    // job of the lane of that kind), else ENDED with its error copied into `error`; a job not taken is forgotten
    // (its slot idle again), a taken one stays until `forget`
    State collect_locked(int64_t job_id, bool taken, std::string &error) {
        if (!holds_locked(job_id, taken)) return IDLE;
        auto it = lane_ended_.find(job_id);
        if (it != lane_ended_.end()) {
            error = it->second.error;
            if (!taken) lane_ended_.erase(it);
            return ENDED;
        }
        const int64_t slot = slot_of_locked(job_id);
        if (state_[slot] != ENDED) return RUNNING;
        error = errors_[slot];
        if (!taken) free_slot_locked(static_cast<size_t>(slot));
        return ENDED;
    }

    // (with the GIL, without mutex_) let go of what collected jobs' callers asked to be held: letting go of the
    // tensors may run Python code (their finalizers), which must not find the mutex held
    void let_go_of_released() {
        std::vector<py::object> released;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            released.swap(released_);
        }
    }

    // (under mutex_) a slot whose lane job has been collected or forgotten: idle, no job, no error
    void free_slot_locked(size_t slot) {
        if (kept_[slot]) released_.push_back(std::move(kept_[slot]));  // (let go of once the mutex is released)
        errors_[slot].clear();
        job_[slot] = -1;
        taken_[slot] = false;
        state_[slot] = IDLE;
    }

    // A wait's timeout for the condition variable: at most a day (longer waits loop), so that no clock overflows
    static std::chrono::milliseconds clamped(int64_t timeout_ms) {
        return std::chrono::milliseconds(std::min<int64_t>(timeout_ms, 86400000));
    }

    // (under mutex_) of lane jobs `job_ids`, the one that ended first (-1: none has)
    int64_t first_ended_locked(const std::vector<int64_t> &job_ids) const {
        int64_t first = -1;
        uint64_t best = UINT64_MAX;
        for (int64_t id : job_ids) {
            uint64_t order;
            auto it = lane_ended_.find(id);
            if (it != lane_ended_.end()) {
                order = it->second.order;
            } else {
                const int64_t slot = slot_of_locked(id);
                if (slot < 0 || state_[slot] != ENDED) continue;
                order = order_[slot];
            }
            if (order < best) {
                best = order;
                first = id;
            }
        }
        return first;
    }

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
            if (job_[slot] >= 0 && !taken_[slot]) {  // a lane job's end, counted as it happens
                ++completed_;
                failed_ += !message.empty();
            }
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
    std::vector<py::object> kept_;  // per slot, what its lane job's caller asked to be held (``launch``'s keep)
    std::vector<py::object> released_;  // kept objects of jobs collected under the mutex, let go of after it
    std::mutex mutex_;
    std::condition_variable cv_;
    std::vector<State> state_;
    std::vector<uint64_t> starts_;  // per slot, runs started on it (a ticket's count)
    std::vector<uint64_t> order_;  // order of ending
    std::vector<std::string> errors_;
    uint64_t ended_ = 0;
    // the lane: per slot, the lane job it runs or ran (-1: none, or a ticket run) and whether the scheduler took it;
    // lane jobs that ended uncollected and left their slot; counts of lane jobs submitted, ended and failed
    struct Ended {
        uint64_t order;
        std::string error;
        bool taken;
    };
    std::vector<int64_t> job_;
    std::vector<bool> taken_;
    std::unordered_map<int64_t, Ended> lane_ended_;
    uint64_t submitted_ = 0, completed_ = 0, failed_ = 0;
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
        .def("finish", &Requests::finish, py::arg("ticket"), py::arg("timeout_ms"))
        .def("reserve", &Requests::reserve, py::arg("job_id"), py::arg("others"), py::arg("limit"), py::arg("tensors"))
        .def("launch", &Requests::launch, py::arg("job_id"), py::arg("tensors"), py::arg("keep") = py::none())
        .def("collect", &Requests::collect, py::arg("job_id"), py::arg("timeout_ms"), py::arg("taken"))
        .def("collect_any", &Requests::collect_any, py::arg("job_ids"), py::arg("timeout_ms"), py::arg("taken"))
        .def("take", &Requests::take, py::arg("job_id"))
        .def("forget", &Requests::forget, py::arg("job_id"))
        .def("jobs", &Requests::jobs)
        .def("running", &Requests::running_count)
        .def("uncollected", &Requests::uncollected)
        .def("counts", &Requests::counts);
}
