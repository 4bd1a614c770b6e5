// npurt._native.Buffer: page-aligned memory that can be handed to a device and to other processes.
//
// Allocation chain ("auto"): /dev/dma_heap/<heap> -> /dev/udmabuf over a memfd sealed against shrinking
// -> a sealed memfd -> page-aligned anonymous host memory. Import of a foreign fd checks what the fd is
// (dma-buf, sealed memfd, regular file), its real size and the offset *before* mmap, so a receiver is
// never handed memory that can vanish under it (SIGBUS). Every fd and mapping is owned by an RAII object;
// errors become Python exceptions (OSError with errno, or ValueError; errors.hpp), never an abort.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "errors.hpp"

namespace py = pybind11;

namespace npurt {
namespace {

// ---- kernel interfaces (layouts from the uapi headers, defined here so old build hosts work) ----
struct DmaHeapAllocationData {
    uint64_t len;
    uint32_t fd;
    uint32_t fd_flags;
    uint64_t heap_flags;
};
static_assert(sizeof(DmaHeapAllocationData) == 24, "dma_heap_allocation_data layout");
constexpr unsigned long kDmaHeapIoctlAlloc = 0xC0184800UL;  // _IOWR('H', 0, struct dma_heap_allocation_data)

struct UdmabufCreate {
    uint32_t memfd;
    uint32_t flags;
    uint64_t offset;
    uint64_t size;
};
static_assert(sizeof(UdmabufCreate) == 24, "udmabuf_create layout");
constexpr unsigned long kUdmabufCreate = 0x40187542UL;  // _IOW('u', 0x42, struct udmabuf_create)
constexpr uint32_t kUdmabufFlagsCloexec = 0x01;

struct DmaBufSync {
    uint64_t flags;
};
constexpr unsigned long kDmaBufIoctlSync = 0x40086200UL;  // _IOW('b', 0, struct dma_buf_sync)
constexpr uint64_t kDmaBufSyncRead = 1, kDmaBufSyncWrite = 2, kDmaBufSyncStart = 0, kDmaBufSyncEnd = 4;

constexpr long kDmaBufMagic = 0x444d4142;  // fstatfs(dma-buf fd).f_type, "DMAB"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif
#ifndef MFD_CLOEXEC
#define MFD_CLOEXEC 0x0001U
#define MFD_ALLOW_SEALING 0x0002U
#endif

size_t page_size() {
    static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return size;
}

size_t round_up_to_page(size_t n, const char *what) {
    const size_t page = page_size();
    if (n > std::numeric_limits<size_t>::max() - page) throw ArgError(std::string(what) + ": size too large");
    return (n + page - 1) / page * page;
}

// ioctl that retries when interrupted; the caller reads errno on failure.
int ioctl_retry(int fd, unsigned long request, void *arg) {
    int rc;
    do {
        rc = ::ioctl(fd, request, arg);
    } while (rc < 0 && (errno == EINTR || errno == EAGAIN));
    return rc;
}

// ---- RAII ----
class UniqueFd {
   public:
    UniqueFd() = default;
    explicit UniqueFd(int fd) : fd_(fd) {}
    UniqueFd(const UniqueFd &) = delete;
    UniqueFd &operator=(const UniqueFd &) = delete;
    UniqueFd(UniqueFd &&other) noexcept : fd_(other.release()) {}
    UniqueFd &operator=(UniqueFd &&other) noexcept {
        if (this != &other) reset(other.release());
        return *this;
    }
    ~UniqueFd() { reset(); }

    int get() const { return fd_; }
    bool valid() const { return fd_ >= 0; }
    int release() { return std::exchange(fd_, -1); }
    void reset(int fd = -1) {
        if (fd_ >= 0) ::close(fd_);  // close() errors are not actionable here (the fd is gone either way)
        fd_ = fd;
    }

   private:
    int fd_ = -1;
};

class Mapping {
   public:
    Mapping() = default;
    Mapping(void *addr, size_t length) : addr_(addr), length_(length) {}
    Mapping(const Mapping &) = delete;
    Mapping &operator=(const Mapping &) = delete;
    Mapping(Mapping &&other) noexcept
        : addr_(std::exchange(other.addr_, nullptr)), length_(std::exchange(other.length_, 0)) {}
    Mapping &operator=(Mapping &&other) noexcept {
        if (this != &other) {
            reset();
            addr_ = std::exchange(other.addr_, nullptr);
            length_ = std::exchange(other.length_, 0);
        }
        return *this;
    }
    ~Mapping() { reset(); }

    // mmap that throws; MAP_SHARED over fd, or private anonymous memory when fd < 0.
    static Mapping map(int fd, size_t length, off_t offset, bool writable, const std::string &what) {
        const int prot = PROT_READ | (writable ? PROT_WRITE : 0);
        const int flags = fd >= 0 ? MAP_SHARED : (MAP_PRIVATE | MAP_ANONYMOUS);
        void *addr = ::mmap(nullptr, length, prot, flags, fd, offset);
        if (addr == MAP_FAILED) fail_errno("mmap of " + what);
        return Mapping(addr, length);
    }

    uint8_t *data() const { return static_cast<uint8_t *>(addr_); }
    size_t length() const { return length_; }
    void reset() {
        if (addr_) ::munmap(addr_, length_);
        addr_ = nullptr;
        length_ = 0;
    }

   private:
    void *addr_ = nullptr;
    size_t length_ = 0;
};

// ---- the buffer ----
class Buffer {
   public:
    std::string provider;  // "dma_heap:<heap>", "udmabuf", "memfd", "host", or for imports also "dma_buf:<exporter>", "file"
    UniqueFd fd;           // invalid for host memory
    Mapping mapping;
    size_t size = 0;       // bytes the caller asked for (the mapping may be longer, page-rounded)
    size_t offset = 0;     // offset of the mapping inside the fd
    bool dmabuf = false;
    bool readonly = false;
    std::vector<std::string> fallback_reasons;  // why each stronger provider was skipped

    Buffer() = default;
    Buffer(const Buffer &) = delete;
    Buffer &operator=(const Buffer &) = delete;
    ~Buffer() {
        // Unmapping (and, for the last reference, freeing) a large buffer takes milliseconds: let other
        // threads run meanwhile, unless the interpreter is shutting down.
        if (mapping.length() >= (1u << 20) && PyGILState_Check() && !interpreter_finalizing()) {
            py::gil_scoped_release release;
            mapping.reset();
            fd.reset();
        }
    }

    static bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
        return Py_IsFinalizing();
#else
        return _Py_IsFinalizing();
#endif
    }

    py::buffer_info view() {
        return py::buffer_info(mapping.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(size)}, {static_cast<py::ssize_t>(1)}, readonly);
    }

    int export_fd() const {
        if (!fd.valid()) return -1;
        int copy = ::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0);
        if (copy < 0) fail_errno("export of " + provider + " buffer (F_DUPFD_CLOEXEC)");
        return copy;
    }

    // DMA_BUF_IOCTL_SYNC start/end; a no-op for memory that is not a dma-buf (ENOTTY for memfd).
    void sync(bool read, bool write, bool end) const {
        if (!read && !write) throw ArgError("sync needs read=True, write=True or both");
        if (!dmabuf || !fd.valid()) return;
        DmaBufSync arg{(read ? kDmaBufSyncRead : 0) | (write ? kDmaBufSyncWrite : 0) |
                       (end ? kDmaBufSyncEnd : kDmaBufSyncStart)};
        if (ioctl_retry(fd.get(), kDmaBufIoctlSync, &arg) < 0 && errno != ENOTTY)
            fail_errno(std::string("DMA_BUF_IOCTL_SYNC ") + (end ? "end" : "start"));
    }
};

UniqueFd sealed_memfd(size_t length, unsigned seals) {
    UniqueFd memfd(::memfd_create("npurt", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!memfd.valid()) fail_errno("memfd_create");
    if (::ftruncate(memfd.get(), static_cast<off_t>(length)) < 0)
        fail_errno("ftruncate of memfd to " + std::to_string(length) + " bytes");
    if (::fcntl(memfd.get(), F_ADD_SEALS, seals) < 0) fail_errno("F_ADD_SEALS on memfd");
    return memfd;
}

void alloc_dma_heap(Buffer &b, const std::string &heap, size_t length) {
    const std::string path = "/dev/dma_heap/" + heap;
    UniqueFd heap_fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
    if (!heap_fd.valid()) fail_errno(path);
    DmaHeapAllocationData data{};
    data.len = length;
    data.fd_flags = O_RDWR | O_CLOEXEC;  // without O_RDWR the dma-buf maps read-only
    if (ioctl_retry(heap_fd.get(), kDmaHeapIoctlAlloc, &data) < 0)
        fail_errno("DMA_HEAP_IOCTL_ALLOC of " + std::to_string(length) + " bytes on " + path);
    b.fd.reset(static_cast<int>(data.fd));
    b.mapping = Mapping::map(b.fd.get(), length, 0, true, path + " buffer");
    b.dmabuf = true;
    b.provider = "dma_heap:" + heap;
}

void alloc_udmabuf(Buffer &b, size_t length) {
    // udmabuf needs F_SEAL_SHRINK and refuses F_SEAL_WRITE; the memfd can be closed once the dma-buf exists.
    UniqueFd memfd = sealed_memfd(length, F_SEAL_SHRINK);
    UniqueFd dev(::open("/dev/udmabuf", O_RDWR | O_CLOEXEC));
    if (!dev.valid()) fail_errno("/dev/udmabuf");
    UdmabufCreate create{};
    create.memfd = static_cast<uint32_t>(memfd.get());
    create.flags = kUdmabufFlagsCloexec;
    create.offset = 0;
    create.size = length;
    int dmabuf_fd;
    do {
        dmabuf_fd = ::ioctl(dev.get(), kUdmabufCreate, &create);
    } while (dmabuf_fd < 0 && (errno == EINTR || errno == EAGAIN));
    if (dmabuf_fd < 0)
        fail_errno("UDMABUF_CREATE of " + std::to_string(length) + " bytes (module size_limit_mb may be lower)");
    b.fd.reset(dmabuf_fd);
    b.mapping = Mapping::map(b.fd.get(), length, 0, true, "udmabuf buffer");
    b.dmabuf = true;
    b.provider = "udmabuf";
}

// memfd and host memory this extension allocates asks for transparent huge pages where it spans one (2 MiB with
// 4 KiB base pages): a CPU engine streaming a 1080p float frame (24 MB in, 24 MB out) ran 1.19 ms on huge pages
// against 1.70 ms on anonymous 4 KiB pages and 1.82 on a memfd's (OpenVINO CPU, 2-core VM), as numpy's large arrays
// get them. Advice only: the kernel's THP setting decides (for memfd memory, shmem_enabled, "never" on many
// distributions), and a refusal changes nothing.
constexpr size_t kHugePageSize = size_t{2} << 20;

void advise_huge_pages(const Mapping &m) {
#ifdef MADV_HUGEPAGE
    if (m.length() >= kHugePageSize) (void)::madvise(m.data(), m.length(), MADV_HUGEPAGE);
#else
    (void)m;
#endif
}

void alloc_memfd(Buffer &b, size_t length) {
    b.fd = sealed_memfd(length, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    b.mapping = Mapping::map(b.fd.get(), length, 0, true, "memfd buffer");
    advise_huge_pages(b.mapping);
    b.provider = "memfd";
}

void alloc_host(Buffer &b, size_t length) {
    b.mapping = Mapping::map(-1, length, 0, true, "anonymous host memory");
    advise_huge_pages(b.mapping);
    b.provider = "host";
}

enum class Provider { DmaHeap, Udmabuf, Memfd, Host };
constexpr Provider kChain[] = {Provider::DmaHeap, Provider::Udmabuf, Provider::Memfd, Provider::Host};

std::string provider_name(Provider p, const std::string &heap) {
    switch (p) {
        case Provider::DmaHeap: return "dma_heap:" + heap;
        case Provider::Udmabuf: return "udmabuf";
        case Provider::Memfd: return "memfd";
        case Provider::Host: return "host";
    }
    return "?";
}

bool valid_heap_name(const std::string &heap) {
    return !heap.empty() && heap != "." && heap != ".." && heap.find('/') == std::string::npos &&
           heap.find('\0') == std::string::npos;
}

// The providers that `provider` (without the inline heap name) asks for, in the order to try them.
// (Returned, not assigned: gcc 12 at -O3 warns -Wnonnull inside vector::operator=(initializer_list).)
std::vector<Provider> providers_to_try(const std::string &provider, bool strict) {
    if (provider == "auto") {
        // strict: no falling to anything weaker than the top of the chain.
        if (strict) return {kChain[0]};
        return {std::begin(kChain), std::end(kChain)};
    }
    if (provider == "dma_heap") return {Provider::DmaHeap};
    if (provider == "udmabuf") return {Provider::Udmabuf};
    if (provider == "memfd") return {Provider::Memfd};
    if (provider == "host") return {Provider::Host};
    throw ArgError("memory provider '" + provider +
                   "' is not one of 'auto', 'dma_heap', 'dma_heap:<heap>', 'udmabuf', 'memfd', 'host'");
}

std::unique_ptr<Buffer> allocate(size_t size, std::string provider, bool strict, std::string heap) {
    // "dma_heap:<name>" names the heap inline.
    if (provider.rfind("dma_heap:", 0) == 0) {
        heap = provider.substr(9);
        provider = "dma_heap";
    }
    if (!valid_heap_name(heap)) throw ArgError("dma-heap name '" + heap + "' is not a name under /dev/dma_heap");
    const std::vector<Provider> candidates = providers_to_try(provider, strict);
    const size_t length = round_up_to_page(size == 0 ? 1 : size, "allocation");
    if (length > static_cast<size_t>(std::numeric_limits<off_t>::max()))
        throw ArgError("allocation of " + std::to_string(size) + " bytes is too large");

    auto buffer = std::make_unique<Buffer>();
    std::vector<std::string> reasons;
    int last_errno = 0;
    {
        py::gil_scoped_release release;
        for (Provider p : candidates) {
            try {
                switch (p) {
                    case Provider::DmaHeap: alloc_dma_heap(*buffer, heap, length); break;
                    case Provider::Udmabuf: alloc_udmabuf(*buffer, length); break;
                    case Provider::Memfd: alloc_memfd(*buffer, length); break;
                    case Provider::Host: alloc_host(*buffer, length); break;
                }
                break;
            } catch (const SysError &e) {
                // Leave nothing half-made behind before trying the next provider.
                buffer->mapping.reset();
                buffer->fd.reset();
                buffer->dmabuf = false;
                reasons.push_back(provider_name(p, heap) + ": " + e.what());
                last_errno = e.err;
            }
        }
    }
    if (!buffer->mapping.data()) {
        std::string msg = "no memory provider could allocate " + std::to_string(size) + " bytes (provider '" +
                          provider + "'" + (strict ? ", strict" : "") + "): ";
        for (size_t i = 0; i < reasons.size(); ++i) msg += (i ? "; " : "") + reasons[i];
        throw SysError(last_errno ? last_errno : ENOMEM, msg, SysError::Verbatim{});
    }
    buffer->size = size;
    buffer->fallback_reasons = std::move(reasons);
    return buffer;
}

// "exp_name" of a dma-buf from /proc/self/fdinfo (the exporter: "system", "udmabuf", a driver name).
std::string dmabuf_exporter(int fd) {
    std::ifstream info("/proc/self/fdinfo/" + std::to_string(fd));
    std::string line;
    while (std::getline(info, line)) {
        if (line.rfind("exp_name:", 0) == 0) {
            size_t start = line.find_first_not_of(" \t", 9);
            return start == std::string::npos ? std::string() : line.substr(start);
        }
    }
    return {};
}

std::string describe_mode(mode_t mode) {
    switch (mode & S_IFMT) {
        case S_IFIFO: return "a pipe";
        case S_IFSOCK: return "a socket";
        case S_IFCHR: return "a character device";
        case S_IFBLK: return "a block device";
        case S_IFDIR: return "a directory";
        case S_IFLNK: return "a symbolic link";
        case 0: return "an anonymous inode (eventfd, epoll, timerfd, ...)";
        default: return "not memory";
    }
}

std::unique_ptr<Buffer> import_fd(int fd, size_t size, size_t offset, bool allow_file) {
    const std::string name = "fd " + std::to_string(fd);
    if (fd < 0) throw ArgError(name + " is not a file descriptor");
    if (size == 0) throw ArgError(name + ": nothing to map (size 0)");
    if (offset % page_size())
        throw ArgError(name + ": offset " + std::to_string(offset) + " is not a multiple of the page size (" +
                       std::to_string(page_size()) + ")");

    auto buffer = std::make_unique<Buffer>();
    {
        py::gil_scoped_release release;  // (throwing without the GIL is safe: errors.hpp)
        const int access = ::fcntl(fd, F_GETFL);
        if (access < 0) {
            if (errno == EBADF) throw SysError(EBADF, name + " is not open");
            fail_errno(name + ": F_GETFL");
        }
        struct statfs fs {};
        if (::fstatfs(fd, &fs) < 0) fail_errno(name + ": fstatfs");
        struct stat st {};
        if (::fstat(fd, &st) < 0) fail_errno(name + ": fstat");

        size_t real_size = 0;
        bool writable = (access & O_ACCMODE) == O_RDWR;
        if (static_cast<long>(fs.f_type) == kDmaBufMagic) {
            buffer->dmabuf = true;
            const off_t end = ::lseek(fd, 0, SEEK_END);  // a dma-buf's size; its st_size may be 0
            if (end < 0) fail_errno(name + ": lseek(SEEK_END) on dma-buf");
            real_size = static_cast<size_t>(end);
            const std::string exporter = dmabuf_exporter(fd);
            if (exporter == "udmabuf") {
                buffer->provider = "udmabuf";
            } else if (!exporter.empty() && valid_heap_name(exporter) &&
                       ::access(("/dev/dma_heap/" + exporter).c_str(), F_OK) == 0) {
                buffer->provider = "dma_heap:" + exporter;
            } else {
                buffer->provider = "dma_buf:" + (exporter.empty() ? std::string("unknown") : exporter);
            }
        } else if (!S_ISREG(st.st_mode)) {
            throw ArgError(name + " is " + describe_mode(st.st_mode) +
                           ", not memory: only a dma-buf, a memfd sealed with F_SEAL_SHRINK or a regular file can "
                           "be mapped");
        } else {
            const int seals = ::fcntl(fd, F_GET_SEALS);
            if (seals >= 0) {
                // A memfd (or tmpfs file): without F_SEAL_SHRINK its owner can truncate it and every process
                // that maps it takes SIGBUS on the next access.
                if (!(seals & F_SEAL_SHRINK)) {
                    char hex[16];
                    std::snprintf(hex, sizeof hex, "%x", seals);
                    throw ArgError(name + " is a memfd without F_SEAL_SHRINK (seals 0x" + hex +
                                   "): its owner could shrink it under the mapping (SIGBUS); the sender must seal "
                                   "it with fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK)");
                }
                if (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) writable = false;
                buffer->provider = "memfd";
            } else if (!allow_file) {
                throw ArgError(name + " is a regular file: its writers can truncate it under the mapping "
                                      "(SIGBUS); send a dma-buf or a memfd sealed with F_SEAL_SHRINK");
            } else {
                buffer->provider = "file";
            }
            real_size = static_cast<size_t>(st.st_size);
        }
        if ((access & O_ACCMODE) == O_WRONLY) throw ArgError(name + " is open write-only and cannot be mapped");
        if (offset > real_size || size > real_size - offset)
            throw ArgError(name + " (" + buffer->provider + ") holds " + std::to_string(real_size) +
                           " bytes; asked for " + std::to_string(size) + " bytes at offset " +
                           std::to_string(offset));
        buffer->mapping = Mapping::map(fd, size, static_cast<off_t>(offset), writable, name);
        // Our own reference: the caller keeps (and may close) its fd number.
        buffer->fd.reset(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
        if (!buffer->fd.valid()) fail_errno(name + ": F_DUPFD_CLOEXEC");
        buffer->readonly = !writable;
    }
    buffer->size = size;
    buffer->offset = offset;
    return buffer;
}

size_t checked_size(py::int_ value, const char *what) {
    // Python ints can be negative or huge; refuse before they wrap around size_t.
    long long v;
    try {
        v = value.cast<long long>();
    } catch (const py::cast_error &) {
        throw ArgError(std::string(what) + " is out of range");
    }
    if (v < 0) throw ArgError(std::string(what) + " " + std::to_string(v) + " is negative");
    return static_cast<size_t>(v);
}

}  // namespace
}  // namespace npurt

void register_buffer(py::module_ &m) {
    using npurt::Buffer;

    py::class_<Buffer>(m, "Buffer", py::buffer_protocol(), R"doc(
Page-aligned memory owned by this object: a dma-buf, a sealed memfd or anonymous host memory.

Make one with ``Buffer.allocate`` or ``Buffer.import_fd``. The buffer protocol gives zero-copy views
(``memoryview(buf)``, ``numpy.frombuffer(buf, ...)``); every view keeps the buffer, and so the mapping and
the fd, alive. ``fd`` is borrowed (do not close it); ``export()`` gives a new fd the caller owns.)doc")
        .def_buffer([](Buffer &b) { return b.view(); })
        .def_static(
            "allocate",
            [](py::int_ size, const std::string &provider, bool strict, const std::string &heap) {
                return npurt::allocate(npurt::checked_size(size, "allocation size"), provider, strict, heap);
            },
            py::arg("size"), py::arg("provider") = "auto", py::arg("strict") = false, py::arg("heap") = "system",
            R"doc(Allocate ``size`` bytes (rounded up to whole pages for the mapping).

provider "auto" tries /dev/dma_heap/<heap>, then /dev/udmabuf over a memfd sealed against shrinking, then
a memfd sealed with F_SEAL_SHRINK|F_SEAL_GROW|F_SEAL_SEAL, then anonymous host memory; ``strict`` refuses
to fall below the first of them. An explicit provider ("dma_heap", "dma_heap:<heap>", "udmabuf", "memfd",
"host") asks for exactly that one. ``fallback_reasons`` says why stronger providers were skipped.
Raises OSError (with the errno of the last attempt) when nothing could allocate, ValueError on bad arguments.)doc")
        .def_static(
            "import_fd",
            [](int fd, py::int_ size, py::int_ offset, bool allow_file) {
                return npurt::import_fd(fd, npurt::checked_size(size, "size"), npurt::checked_size(offset, "offset"),
                                        allow_file);
            },
            py::arg("fd"), py::arg("size"), py::arg("offset") = 0, py::arg("allow_file") = true,
            R"doc(Map ``size`` bytes at ``offset`` of a foreign fd, after checking it.

Accepted: a dma-buf (fstatfs magic), a memfd carrying F_SEAL_SHRINK, a regular file (unless
``allow_file`` is False: a file can be truncated under the mapping). The real size must cover
offset + size and the offset must be page-aligned. The fd is duplicated: the caller keeps its own.
Raises ValueError for an fd that is not acceptable memory, OSError for a closed fd or a failed mmap.)doc")
        .def_property_readonly("provider", [](const Buffer &b) { return b.provider; },
                               "Where the memory came from: 'dma_heap:<heap>', 'udmabuf', 'memfd', 'host', or for "
                               "imports 'dma_buf:<exporter>' / 'file'.")
        .def_property_readonly("size", [](const Buffer &b) { return b.size; })
        .def_property_readonly("offset", [](const Buffer &b) { return b.offset; },
                               "Offset of the mapping inside the fd (imports only; 0 for allocations).")
        .def_property_readonly("fd", [](const Buffer &b) { return b.fd.get(); },
                               "The buffer's own fd (borrowed: do not close it), -1 for host memory.")
        .def_property_readonly("address", [](const Buffer &b) { return reinterpret_cast<uintptr_t>(b.mapping.data()); })
        .def_property_readonly("is_dmabuf", [](const Buffer &b) { return b.dmabuf; })
        .def_property_readonly("readonly", [](const Buffer &b) { return b.readonly; })
        .def_property_readonly("fallback_reasons", [](const Buffer &b) { return b.fallback_reasons; })
        .def("export", [](const Buffer &b) { return b.export_fd(); },
             "A new fd (O_CLOEXEC) for the same memory that the caller owns and must close; -1 for host memory.")
        .def(
            "sync_start",
            [](const Buffer &b, bool read, bool write) {
                py::gil_scoped_release release;
                b.sync(read, write, false);
            },
            py::arg("read") = true, py::arg("write") = true,
            "Begin CPU access (DMA_BUF_IOCTL_SYNC start); a no-op where the memory is not a dma-buf.")
        .def(
            "sync_end",
            [](const Buffer &b, bool read, bool write) {
                py::gil_scoped_release release;
                b.sync(read, write, true);
            },
            py::arg("read") = true, py::arg("write") = true,
            "End CPU access (DMA_BUF_IOCTL_SYNC end); a no-op where the memory is not a dma-buf.")
        .def("__len__", [](const Buffer &b) { return b.size; })
        .def("__repr__", [](const Buffer &b) {
            return "<npurt._native.Buffer " + b.provider + " size=" + std::to_string(b.size) +
                   " fd=" + std::to_string(b.fd.get()) + (b.readonly ? " readonly" : "") + ">";
        });
}
